//! Flag profiles: the ways users run the proxy, each a named set of proxy flags. The suite runs every scenario
//! through the proxy binary once per profile, and every profile must answer like direct etcd.
//!
//! - `default`: the flags users get when they give none.
//! - `namespace`: `--namespace=/conformance-ns/`; clients see a whole keyspace that etcd keeps under that prefix.
//!   Every scenario must answer as on direct etcd (keys come back without the prefix), and the suite also reads
//!   etcd itself after each run: it must hold the run's keys under the prefix, and (on a fresh etcd) nothing
//!   outside it.
//!
//! A profile that also needs etcd or its clients set up differently (TLS: certificates for etcd and for etcdctl;
//! chain: a second proxy in front of the first) adds that here, next to its flags, so that every harness using
//! profiles gets it in one place. Where a profile keeps keys in etcd ([`Profile::namespace`]) is read from its
//! flags, so the two cannot disagree.
//!
//! `CONFORMANCE_PROFILES=a,b` selects profiles by name (`all` for every one); without it every profile runs.

/// One way of running the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Profile {
    /// Its name in reports and in `CONFORMANCE_PROFILES`.
    pub name: &'static str,
    /// The proxy flags beyond `--endpoints` and `--listen-addr`, as a user would give them.
    pub flags: &'static [&'static str],
}

/// Every profile, in report order.
pub const ALL: &[Profile] = &[
    Profile {
        name: "default",
        flags: &[],
    },
    Profile {
        name: "namespace",
        flags: &["--namespace=/conformance-ns/"],
    },
];

impl Profile {
    /// The prefix under which etcd keeps the keys a client gives the proxy: its `--namespace` (empty: none).
    pub fn namespace(&self) -> &'static str {
        self.flags
            .iter()
            .find_map(|f| f.strip_prefix("--namespace="))
            .unwrap_or("")
    }
}

/// The profiles this run covers: those `CONFORMANCE_PROFILES` names, or all. An unknown name is an error that
/// lists the known ones.
pub fn selected() -> Result<Vec<Profile>, String> {
    match std::env::var("CONFORMANCE_PROFILES") {
        Ok(list) => parse(&list),
        Err(_) => Ok(ALL.to_vec()),
    }
}

fn parse(list: &str) -> Result<Vec<Profile>, String> {
    let mut out = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name == "all" {
            return Ok(ALL.to_vec());
        }
        let p = ALL.iter().find(|p| p.name == name).ok_or_else(|| {
            format!(
                "unknown profile {name:?} in CONFORMANCE_PROFILES; known: {}",
                ALL.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
            )
        })?;
        if !out.contains(p) {
            out.push(*p);
        }
    }
    if out.is_empty() {
        return Err("CONFORMANCE_PROFILES names no profile".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_select_profiles_and_unknown_names_are_refused() {
        assert_eq!(parse("default").unwrap(), vec![ALL[0]]);
        assert_eq!(parse("all").unwrap(), ALL.to_vec());
        assert_eq!(parse("default, default").unwrap(), vec![ALL[0]]);
        let err = parse("tls-typo").unwrap_err();
        assert!(err.contains("tls-typo") && err.contains("default"), "{err}");
        assert!(parse(" , ").is_err());
    }

    #[test]
    fn a_profile_keeps_keys_under_its_namespace_flag() {
        let namespaced = ALL.iter().find(|p| p.name == "namespace").unwrap();
        assert_eq!(namespaced.namespace(), "/conformance-ns/");
        assert_eq!(ALL[0].namespace(), "");
    }

    #[test]
    fn profile_names_are_unique() {
        let mut names: Vec<&str> = ALL.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }
}
