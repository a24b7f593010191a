//! Flag profiles: the ways users run the proxy, each a named set of proxy flags. The suite runs every scenario
//! through the proxy binary once per profile, and every profile must answer like direct etcd.
//!
//! - `default`: the flags users get when they give none.
//! - `namespace`: `--namespace=/conformance-ns/`; clients see a whole keyspace that etcd keeps under that prefix.
//!   Every scenario must answer as on direct etcd (keys come back without the prefix), and the suite also reads
//!   etcd itself after each run: it must hold the run's keys under the prefix, and (on a fresh etcd) nothing
//!   outside it.
//! - `tls`: TLS on both sides ([`Transport::Tls`]): etcd serves `https://` with `--client-cert-auth`, the proxy
//!   talks mutual TLS to it (`--cacert`, `--cert`, `--key`: a certificate without a Common Name) and serves its
//!   clients TLS requiring their certificates (`--cert-file`, `--key-file`, `--trusted-ca-file`); etcdctl and the
//!   Rust clients present CN-less client certificates. Its answers are compared with direct etcd's over TLS (the
//!   same clients, with a CN-less certificate of etcd's CA), which must in turn answer like direct etcd in the
//!   clear apart from what TLS itself changes (`crate::suite`'s `TRANSPORT_NEUTRAL`: URL schemes, and `permission
//!   denied` for `user name is empty`). Two CAs, one per side of the proxy, made per run ([`crate::tls::Pki`]).
//! - `chain`: a tree of proxies, two deep: a proxy in front of a proxy in front of etcd, each with the flags users
//!   get when they give none ([`Profile::proxies`] is 2). Clients talk to the front proxy, whose `--endpoints` is
//!   the back proxy; so every call, watch and keep-alive crosses two proxies, and the front one's coalesced
//!   upstream streams are the back one's clients: both coalescers must compose and still answer like etcd. In the
//!   clear.
//! - `cache`: the range cache on, squeezed to 64 KiB (`--range-cache-max-bytes=65536`), so that copies of ranges
//!   are evicted and filled again all the time; every scenario must still answer like direct etcd. In the clear.
//!
//! - `container` and `container-tls`: the proxy run from its container image (`deploy/container/Dockerfile`, as
//!   operators run it: non-root, its certificate files mounted into it) with the flags of `default` and `tls`. They
//!   are the suite's `container` target, and run in front of the newest etcd in a container (the `testcontainers`
//!   backend) only.
//!
//! The cache is on by default, so under every profile the front proxy must have answered some Range from it
//! (`cache/answered` in the suite).
//!
//! A profile that also needs etcd or its clients set up differently (TLS: certificates for etcd and for etcdctl;
//! chain: a second proxy in front of the first) adds that here, next to its flags, so that every harness using
//! profiles gets it in one place: [`Setup`] starts etcd and the proxies for a profile, [`Proxies`] keeps them
//! running together, and [`Endpoint`] tells a client how to reach etcd or the front proxy. Where a profile keeps
//! keys in etcd ([`Profile::namespace`]) is read from its flags, so the two cannot disagree.
//!
//! `CONFORMANCE_PROFILES=a,b` selects profiles by name (`all` for every one); without it every profile runs.

use testkit::pki::TlsPaths;
use testkit::{Binaries, Etcd, Etcdctl, ProxyProcess, Spec};

use crate::tls::Pki;

/// How etcd, the proxy and their clients talk under a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Transport {
    /// In the clear.
    Plain,
    /// TLS on both sides of the proxy, client certificates required everywhere.
    Tls,
}

impl Transport {
    /// Its name in reports: direct etcd under it is the row `direct | tls`.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Plain => "plain",
            Transport::Tls => "tls",
        }
    }
}

/// One way of running the proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Profile {
    /// Its name in reports and in `CONFORMANCE_PROFILES`.
    pub name: &'static str,
    /// The proxy flags beyond `--endpoints` and `--listen-addr` that need nothing made at run time, as a user would
    /// give them; [`Setup::start_proxy`] adds the transport's (certificate paths).
    pub flags: &'static [&'static str],
    /// How etcd, the proxy and the clients talk.
    pub transport: Transport,
    /// How many proxies stand in a row between the clients and etcd, each started with `flags` and each the
    /// previous one's only endpoint: 1, or 2 for a proxy in front of a proxy (`chain`).
    pub proxies: usize,
    /// Whether the proxy runs from its container image rather than as a process of the binary.
    pub image: bool,
}

/// Every profile, in report order.
pub const ALL: &[Profile] = &[
    Profile {
        name: "default",
        flags: &[],
        transport: Transport::Plain,
        proxies: 1,
        image: false,
    },
    Profile {
        name: "namespace",
        flags: &["--namespace=/conformance-ns/"],
        transport: Transport::Plain,
        proxies: 1,
        image: false,
    },
    Profile {
        name: "tls",
        flags: &[],
        transport: Transport::Tls,
        proxies: 1,
        image: false,
    },
    Profile {
        name: "chain",
        flags: &[],
        transport: Transport::Plain,
        proxies: 2,
        image: false,
    },
    Profile {
        name: "cache",
        flags: &["--range-cache-max-bytes=65536"],
        transport: Transport::Plain,
        proxies: 1,
        image: false,
    },
    Profile {
        name: "container",
        flags: &[],
        transport: Transport::Plain,
        proxies: 1,
        image: true,
    },
    Profile {
        name: "container-tls",
        flags: &[],
        transport: Transport::Tls,
        proxies: 1,
        image: true,
    },
];

impl Profile {
    /// The prefix under which etcd keeps the keys a client gives the proxy: its `--namespace` (empty: none), once
    /// per proxy in the row, since each of them prefixes what it forwards.
    pub fn namespace(&self) -> String {
        self.flags
            .iter()
            .find_map(|f| f.strip_prefix("--namespace="))
            .unwrap_or("")
            .repeat(self.proxies)
    }

    /// Whether it runs in front of etcd `version` of `backend`: a profile of the image only in front of the newest
    /// etcd in a container. The image holds the binary the `proxy` target runs on every version; what the image
    /// adds (its user, its mounted files, its network) does not depend on etcd's version.
    pub fn runs_on(&self, backend: testkit::Backend, version: testkit::Version) -> bool {
        !self.image
            || (backend == testkit::Backend::Container && version == testkit::Version::NEWEST)
    }

    /// The target it makes of the proxy: `container` when run from the image, else `proxy`.
    pub fn target(&self) -> crate::target::TargetKind {
        if self.image {
            crate::target::TargetKind::Container
        } else {
            crate::target::TargetKind::Proxy
        }
    }
}

/// The transports direct etcd runs on for `profiles`: in the clear always (its answers are the reference, pinned by
/// snapshots), then every other transport a profile uses, each once (the proxy under a profile is compared with
/// direct etcd on the profile's transport).
pub fn transports(profiles: &[Profile]) -> Vec<Transport> {
    let mut out = vec![Transport::Plain];
    for p in profiles {
        if !out.contains(&p.transport) {
            out.push(p.transport);
        }
    }
    out
}

/// What the profiles of a run need made at run time (the `tls` profile's certificates), and the one way every
/// harness starts etcd and the proxy for a profile. Owned by the harness for the run: the certificate files go
/// with it.
pub struct Setup {
    pki: Option<Pki>,
}

impl Setup {
    /// Makes what `profiles` need: certificates when one of them uses TLS.
    pub fn new(profiles: &[Profile]) -> Result<Setup, String> {
        let pki = if profiles.iter().any(|p| p.transport == Transport::Tls) {
            Some(Pki::new()?)
        } else {
            None
        };
        Ok(Setup { pki })
    }

    fn pki(&self, transport: Transport) -> Result<Option<&Pki>, String> {
        match transport {
            Transport::Plain => Ok(None),
            Transport::Tls => self.pki.as_ref().map(Some).ok_or_else(|| {
                "no certificates were made for TLS: Setup::new got no TLS profile".into()
            }),
        }
    }

    /// Starts one etcd member as `spec` says for `transport`, with `extra_args`, and waits until it is healthy.
    pub async fn start_etcd(
        &self,
        spec: &Spec,
        transport: Transport,
        extra_args: &[&str],
    ) -> Result<Etcd, String> {
        let tls = self.pki(transport)?.map(|p| &p.etcd);
        Etcd::start_with(spec, extra_args, tls).await
    }

    /// Starts the proxy's release binary (what users run) in front of `etcd` with `profile`'s flags, those of its
    /// transport, then `extra` (a case's own flags, e.g. a smaller `--max-send-bytes`), on a free loopback port;
    /// as many of them in a row as the profile has [`Profile::proxies`], each started with the same flags (an
    /// operator configures every proxy of a tree alike, `extra` included: a `--max-send-bytes` matching etcd's
    /// request limit is true of each) and each the next one's only endpoint. `etcd` must run on the profile's
    /// transport. Each proxy is healthy before the next starts (the kit waits for its `/health`), so the front
    /// one finds its upstream up.
    pub async fn start_proxy(
        &self,
        profile: &Profile,
        etcd: &Etcd,
        extra: &[&str],
    ) -> Result<Proxies, String> {
        if self.pki(profile.transport)?.is_some() != etcd.tls().is_some() {
            return Err(format!(
                "the {} profile needs etcd on its transport ({}), not {}",
                profile.name,
                profile.transport.name(),
                etcd.endpoint()
            ));
        }
        self.start_proxy_for(profile, &[etcd.endpoint()], extra)
            .await
    }

    /// [`Setup::start_proxy`] in front of `members` (client endpoints of one etcd cluster, on the profile's
    /// transport): the proxy next to etcd gets all of them as its `--endpoints`.
    pub async fn start_proxy_for(
        &self,
        profile: &Profile,
        members: &[String],
        extra: &[&str],
    ) -> Result<Proxies, String> {
        let pki = self.pki(profile.transport)?;
        if profile.proxies == 0 {
            return Err(format!("the {} profile has no proxy", profile.name));
        }
        // A proxy in front of a TLS proxy would need a client certificate of the proxy CA towards its upstream,
        // which the run does not make; no profile asks for it.
        if profile.proxies > 1 && pki.is_some() {
            return Err(format!(
                "the {} profile: a row of {} proxies runs in the clear only",
                profile.name, profile.proxies
            ));
        }
        let bin = testkit::proxy::binary()?;
        let mut flags: Vec<String> = profile.flags.iter().map(|f| f.to_string()).collect();
        flags.extend(pki.iter().flat_map(|p| p.proxy_flags()));
        flags.extend(extra.iter().map(|f| f.to_string()));
        let client = pki.map(|p| p.proxy_clients.clone());
        // From etcd outwards: the first proxy's upstream is etcd, every later one's the proxy started before it.
        let mut started: Vec<ProxyProcess> = Vec::with_capacity(profile.proxies);
        for n in 1..=profile.proxies {
            let upstreams = started
                .last()
                .map_or_else(|| members.to_vec(), |p| vec![p.endpoint()]);
            let proxy = if profile.image {
                ProxyProcess::start_image(&upstreams, &flags, client.clone()).await
            } else {
                ProxyProcess::start_with(&bin, &upstreams, &flags, &[], client.clone()).await
            };
            let proxy = proxy.map_err(|e| {
                format!(
                    "the proxy ({} profile, {n} of {} from etcd): {e}",
                    profile.name, profile.proxies
                )
            })?;
            started.push(proxy);
        }
        // Front first: dropped (killed) in that order, no proxy is left running without its upstream.
        started.reverse();
        Ok(Proxies { row: started })
    }
}

/// The proxies of one profile, running together in a row in front of etcd ([`Setup::start_proxy`]): one, or for
/// `chain` a proxy in front of a proxy. Clients talk to the front one ([`Endpoint::proxy`]). Dropping it kills
/// every one of them, the front one first (the kit's [`ProxyProcess`] kills on drop, and prints its log tail
/// first during a panic).
pub struct Proxies {
    /// Never empty; the front proxy (the one clients talk to) first, the one in front of etcd last.
    row: Vec<ProxyProcess>,
}

impl Proxies {
    /// The proxy the clients talk to.
    pub fn front(&self) -> &ProxyProcess {
        &self.row[0]
    }

    /// The proxy next to etcd (the front one but for `chain`): the one whose upstream is etcd's members.
    pub fn back(&self) -> &ProxyProcess {
        &self.row[self.row.len() - 1]
    }

    /// The front proxy, the row given up for it (the only one of a one-proxy row).
    pub fn into_front(mut self) -> ProxyProcess {
        self.row.swap_remove(0)
    }

    /// Every proxy of the row, the front one first.
    pub fn all(&self) -> &[ProxyProcess] {
        &self.row
    }
}

/// How a client reaches a target: the endpoint it is given, and with TLS the CA it checks the server against and
/// the certificate it presents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with TLS: what etcdctl's `--endpoints` takes.
    pub endpoint: String,
    pub tls: Option<TlsPaths>,
}

impl Endpoint {
    /// Direct etcd, presenting the certificate the kit gives its clients.
    pub fn etcd(etcd: &Etcd) -> Endpoint {
        Endpoint {
            endpoint: etcd.endpoint(),
            tls: etcd.tls().map(|t| t.client.clone()),
        }
    }

    /// The front proxy of a profile's row (the only one but for `chain`), presenting the certificate it was
    /// started for.
    pub fn proxy(proxies: &Proxies) -> Endpoint {
        let front = proxies.front();
        Endpoint {
            endpoint: front.endpoint(),
            tls: front.client_tls().cloned(),
        }
    }

    /// A server in the clear at `addr` (`127.0.0.1:PORT`), such as the model.
    pub fn plain(addr: String) -> Endpoint {
        Endpoint {
            endpoint: addr,
            tls: None,
        }
    }

    /// Its URL, with the scheme: `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT` (what tonic takes).
    pub fn url(&self) -> String {
        if self.endpoint.contains("://") {
            self.endpoint.clone()
        } else {
            format!("http://{}", self.endpoint)
        }
    }

    /// `binaries`' etcdctl talking to it.
    pub fn etcdctl(&self, binaries: &Binaries) -> Etcdctl {
        let ctl = binaries.etcdctl(&self.endpoint);
        match &self.tls {
            None => ctl,
            Some(tls) => ctl.with_tls(tls),
        }
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
    fn a_profile_keeps_keys_under_its_namespace_flag_once_per_proxy() {
        let namespaced = ALL.iter().find(|p| p.name == "namespace").unwrap();
        assert_eq!(namespaced.namespace(), "/conformance-ns/");
        assert_eq!(ALL[0].namespace(), "");
        let two_deep = Profile {
            proxies: 2,
            ..*namespaced
        };
        assert_eq!(two_deep.namespace(), "/conformance-ns//conformance-ns/");
    }

    #[test]
    fn chain_is_two_default_proxies_in_the_clear_and_every_other_profile_one() {
        let chain = ALL.iter().find(|p| p.name == "chain").unwrap();
        assert_eq!(
            (chain.flags, chain.transport, chain.proxies),
            (&[][..], Transport::Plain, 2)
        );
        assert_eq!(chain.namespace(), "");
        assert!(ALL.iter().all(|p| p.proxies == 1 || p.name == "chain"));
    }

    #[test]
    fn direct_etcd_runs_in_the_clear_and_on_every_other_transport_a_profile_uses() {
        let tls = *ALL.iter().find(|p| p.name == "tls").unwrap();
        assert_eq!(tls.transport, Transport::Tls);
        assert_eq!(tls.namespace(), "");
        assert_eq!(transports(&[ALL[0]]), [Transport::Plain]);
        assert_eq!(transports(&[tls]), [Transport::Plain, Transport::Tls]);
        assert_eq!(
            transports(ALL),
            [Transport::Plain, Transport::Tls],
            "one TLS etcd however many profiles use it"
        );
    }

    #[test]
    fn certificates_are_made_only_for_a_tls_profile() {
        let plain = Setup::new(&ALL[..2]).unwrap();
        assert!(plain.pki.is_none());
        assert!(plain.pki(Transport::Tls).is_err());
        let tls = Setup::new(ALL).unwrap();
        let pki = tls.pki(Transport::Tls).unwrap().expect("certificates");
        assert!(pki.etcd.server.cert.is_file());
        assert!(tls.pki(Transport::Plain).unwrap().is_none());
    }

    #[test]
    fn an_endpoint_gives_etcdctl_its_tls_files_and_tonic_a_url() {
        let plain = Endpoint::plain("127.0.0.1:1".into());
        assert_eq!(plain.url(), "http://127.0.0.1:1");
        let files = TlsPaths {
            ca: "/x/ca.pem".into(),
            cert: "/x/c.pem".into(),
            key: "/x/k.pem".into(),
        };
        let tls = Endpoint {
            endpoint: "https://127.0.0.1:2".into(),
            tls: Some(files),
        };
        assert_eq!(tls.url(), "https://127.0.0.1:2");
        let binaries = Binaries {
            version: testkit::Version::V3_5_30,
            etcd: "etcd".into(),
            etcdctl: "etcdctl".into(),
        };
        assert!(plain.etcdctl(&binaries).leading_args().is_empty());
        let ctl = tls.etcdctl(&binaries);
        assert_eq!(ctl.endpoint(), "https://127.0.0.1:2");
        assert_eq!(
            ctl.leading_args(),
            ["--cacert=/x/ca.pem", "--cert=/x/c.pem", "--key=/x/k.pem"]
        );
    }

    #[test]
    fn profile_names_are_unique() {
        let mut names: Vec<&str> = ALL.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }
}
