//! deploy/kubernetes/'s manifests run the proxy as written: every proxy container's args (after the kubelet's
//! `$(VAR)` expansion) are flags the binary's own parser (`proxy::cli::parse`, what `main` runs) accepts; every
//! probe and declared port reaches a listener those flags open, with the scheme that listener speaks and from where
//! the kubelet dials; readiness is `/proxy/health` and liveness needs no etcd; the TLS files come from Secrets
//! mounted read-only; the pods are hardened and their limits fit the proxy's bounds and its shutdown drain. The
//! Deployment registers itself under `--resolver-prefix` at its pod IP, behind a Service and a PodDisruptionBudget,
//! spread over nodes; the DaemonSet serves node-local clients on the node's loopback. Run with each manifest's args
//! (moved to loopback ports, with test certificates in the Secrets' place) in front of real etcd with mutual TLS,
//! the proxy turns ready, and when etcd dies its readiness probe fails while its liveness probe still passes.
//! (ci/validate-kubernetes.sh checks the same files against Kubernetes' API schemas.)

mod support;

#[path = "deploy_kubernetes/manifests.rs"]
mod manifests;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use manifests::{POD_IP, PROXY_IMAGE, Resource, expanded_args, port_number, selects, seq};
use proxy::cli::Cli;
use serde_yaml_ng::Value;
use support::proxy::PROXY_BIN;
use testkit::pki::{Ca, Leaf, TlsPaths};
use testkit::{EtcdCluster, ProxyProcess, wait_for};

/// The image's entry point is `etcd-grpc-proxy start`: the manifests give only flags.
fn parse(args: &[String]) -> Result<Cli, String> {
    let argv = ["etcd-grpc-proxy", "start"]
        .into_iter()
        .map(str::to_owned)
        .chain(args.iter().cloned());
    proxy::cli::parse(argv, || 0).map_err(|e| e.to_string())
}

/// Each workload running the proxy, with each of its proxy containers and what their args parse to.
fn proxy_workloads(resources: &[Resource]) -> Vec<(&Resource, &Value, Cli)> {
    let mut out = Vec::new();
    for resource in resources {
        for container in resource.proxy_containers() {
            assert!(
                container.get("command").is_none(),
                "{}: `command` would replace the image's entry point (`etcd-grpc-proxy start`); give flags as args",
                resource.id()
            );
            // The image is tagged with the crate's version: a release bumps the manifests with it.
            let image = container["image"].as_str().unwrap_or_default();
            assert_eq!(
                image,
                format!("{PROXY_IMAGE}{}", env!("CARGO_PKG_VERSION")),
                "{}",
                resource.id()
            );
            let args = expanded_args(container);
            let cli = parse(&args).unwrap_or_else(|e| {
                panic!(
                    "{}: the proxy refuses its args {args:?}:\n{e}",
                    resource.id()
                )
            });
            out.push((resource, container, cli));
        }
    }
    out
}

#[test]
fn every_proxy_container_passes_only_flags_the_binary_accepts() {
    let resources = manifests::all();
    let workloads = proxy_workloads(&resources);
    let kinds: Vec<&str> = workloads.iter().map(|(r, _, _)| r.kind()).collect();
    assert!(
        kinds.contains(&"Deployment") && kinds.contains(&"DaemonSet"),
        "expected a Deployment and a DaemonSet running the proxy, found {kinds:?}"
    );
    // The test's parser is the binary's: a flag it does not know fails here as it would fail the pod.
    let err = parse(&["--no-such-flag".to_owned()]).unwrap_err();
    assert!(err.contains("--no-such-flag"), "{err}");
}

/// A listener the proxy's flags open.
#[derive(Debug)]
struct Listener {
    ip: IpAddr,
    port: u16,
    tls: bool,
    /// Clients must present a certificate (`--trusted-ca-file`): the kubelet presents none.
    client_certs: bool,
}

fn listeners(cli: &Cli) -> Vec<Listener> {
    let config = &cli.config;
    let client_certs = config
        .server_tls
        .as_ref()
        .is_some_and(|tls| tls.trusted_ca.is_some());
    let mut out = vec![Listener {
        ip: config.listen_addr.ip(),
        port: config.listen_addr.port(),
        tls: config.server_tls.is_some(),
        client_certs,
    }];
    if let Some(metrics) = &config.metrics_listen {
        out.push(Listener {
            ip: metrics.addr.ip(),
            port: metrics.addr.port(),
            tls: metrics.tls,
            // An https:// --metrics-addr serves with the clients' TLS settings, client certificates included.
            client_certs: metrics.tls && client_certs,
        });
    }
    out
}

/// Checks that the kubelet's probe `probe` reaches one of `listeners` and speaks its scheme; returns its httpGet
/// path (`None` for a tcpSocket probe).
fn check_probe(
    id: &str,
    which: &str,
    probe: &Value,
    container: &Value,
    host_network: bool,
    listeners: &[Listener],
) -> Option<String> {
    let (action, path) = if probe.get("httpGet").is_some() {
        let path = probe["httpGet"]["path"].as_str().unwrap_or("/").to_owned();
        (&probe["httpGet"], Some(path))
    } else if probe.get("tcpSocket").is_some() {
        (&probe["tcpSocket"], None)
    } else {
        panic!("{id}: {which} is neither httpGet nor tcpSocket: {probe:?}");
    };
    let port = port_number(&action["port"], container);
    let listener = listeners
        .iter()
        .find(|l| l.port == port)
        .unwrap_or_else(|| {
            panic!("{id}: {which}'s port {port} is none of the proxy's listeners {listeners:?}")
        });
    // The kubelet dials `host`, by default the pod IP (the node's own address with hostNetwork).
    match action["host"].as_str() {
        None => assert!(
            listener.ip.is_unspecified(),
            "{id}: {which} dials the pod IP, but the listener on port {port} is bound to {}",
            listener.ip
        ),
        Some(host) => {
            assert!(
                host_network,
                "{id}: {which} names host {host}, which is not the pod without hostNetwork"
            );
            let host: IpAddr = host.parse().expect("a probe host IP");
            assert!(
                listener.ip.is_unspecified() || listener.ip == host,
                "{id}: {which} dials {host}, but the listener on port {port} is bound to {}",
                listener.ip
            );
        }
    }
    if path.is_some() {
        let scheme = action["scheme"].as_str().unwrap_or("HTTP");
        let wanted = if listener.tls { "HTTPS" } else { "HTTP" };
        assert_eq!(scheme, wanted, "{id}: {which}'s scheme on port {port}");
        assert!(
            !listener.client_certs,
            "{id}: {which} on port {port}, which requires client certificates the kubelet does not present"
        );
    }
    path
}

#[test]
fn probes_and_ports_reach_listeners_the_args_open() {
    let resources = manifests::all();
    for (resource, container, cli) in proxy_workloads(&resources) {
        let id = resource.id();
        let spec = resource.pod_spec().expect("a workload");
        let host_network = spec["hostNetwork"].as_bool() == Some(true);
        let listeners = listeners(&cli);
        let readiness = check_probe(
            &id,
            "readinessProbe",
            &container["readinessProbe"],
            container,
            host_network,
            &listeners,
        );
        // Ready only when the proxy serves a read and a watch through its own listener.
        assert_eq!(readiness.as_deref(), Some("/proxy/health"), "{id}");
        let liveness = check_probe(
            &id,
            "livenessProbe",
            &container["livenessProbe"],
            container,
            host_network,
            &listeners,
        );
        // /health and /proxy/health fail while etcd is down: a liveness probe on them would restart every proxy
        // in an etcd outage. /proxy/metrics and an open port depend on the proxy alone.
        assert!(
            matches!(liveness.as_deref(), None | Some("/proxy/metrics")),
            "{id}: liveness on {liveness:?}: it must not depend on etcd"
        );
        if container.get("startupProbe").is_some() {
            check_probe(
                &id,
                "startupProbe",
                &container["startupProbe"],
                container,
                host_network,
                &listeners,
            );
        }
        for port in seq(&container["ports"]) {
            let number = port_number(&port["containerPort"], container);
            assert!(
                listeners.iter().any(|l| l.port == number),
                "{id}: containerPort {number} is none of the proxy's listeners {listeners:?}"
            );
        }
    }
}

/// Every file the flags name for TLS.
fn tls_files(cli: &Cli) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(upstream) = &cli.config.upstream_tls {
        out.extend(upstream.ca.clone());
        if let Some((cert, key)) = &upstream.identity {
            out.extend([cert.clone(), key.clone()]);
        }
    }
    if let Some(server) = &cli.config.server_tls {
        if let proxy::tls::server::Certificate::Files { cert, key } = &server.certificate {
            out.extend([cert.clone(), key.clone()]);
        }
        out.extend(server.trusted_ca.clone());
        out.extend(server.crl.clone());
    }
    out
}

#[test]
fn tls_files_come_from_secrets_mounted_read_only() {
    let resources = manifests::all();
    let mut checked = 0;
    for (resource, container, cli) in proxy_workloads(&resources) {
        let id = resource.id();
        let volumes = seq(&resource.pod_spec().expect("a workload")["volumes"]);
        let files = tls_files(&cli);
        assert!(
            cli.config.upstream_tls.is_some(),
            "{id}: the proxy talks to etcd without TLS"
        );
        for file in files {
            let mount = seq(&container["volumeMounts"])
                .iter()
                .find(|m| {
                    m["mountPath"]
                        .as_str()
                        .is_some_and(|dir| file.starts_with(Path::new(dir)))
                })
                .unwrap_or_else(|| panic!("{id}: {} is in no volume mount", file.display()));
            assert_eq!(mount["readOnly"].as_bool(), Some(true), "{id}: {mount:?}");
            // A subPath mount would never see a renewed Secret.
            assert!(mount.get("subPath").is_none(), "{id}: {mount:?}");
            let volume = volumes
                .iter()
                .find(|v| v["name"] == mount["name"])
                .unwrap_or_else(|| panic!("{id}: no volume {:?}", mount["name"]));
            assert!(
                volume["secret"]["secretName"].is_string(),
                "{id}: {} is not from a Secret: {volume:?}",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no TLS files in the manifests");
}

/// A Kubernetes memory quantity (`64Mi`, `1Gi`, `500M`, bytes) in bytes.
fn bytes(quantity: &str) -> u64 {
    let split = quantity
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(quantity.len());
    let (number, unit) = quantity.split_at(split);
    let number: u64 = number
        .parse()
        .unwrap_or_else(|_| panic!("quantity {quantity:?}"));
    let scale: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => panic!("quantity {quantity:?}: a unit this test does not read"),
    };
    number * scale
}

/// A Kubernetes CPU quantity (`1`, `500m`) in thousandths of a core.
fn millicores(value: &Value) -> u64 {
    let quantity = match value {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        other => panic!("a CPU quantity: {other:?}"),
    };
    match quantity.strip_suffix('m') {
        Some(m) => m.parse().expect("millicores"),
        None => quantity.parse::<u64>().expect("cores") * 1000,
    }
}

/// What the proxy needs beyond its range cache: about 12 MiB idle, and about 14 MiB per 100 calls in flight
/// (README.md, "gives up on calls").
const MEMORY_BEYOND_THE_CACHE: u64 = 64 << 20;

/// The numeric `USER uid:gid` of the container image (`deploy/container/Dockerfile`).
fn image_user() -> (u64, u64) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/container/Dockerfile");
    let text = std::fs::read_to_string(&path).expect("deploy/container/Dockerfile");
    let user = text
        .lines()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the Dockerfile names its USER");
    let (uid, gid) = user.trim().split_once(':').expect("USER uid:gid");
    (
        uid.parse().expect("a numeric uid"),
        gid.parse().expect("a numeric gid"),
    )
}

#[test]
fn pods_are_hardened_and_their_limits_fit_the_proxy() {
    let resources = manifests::all();
    for (resource, container, cli) in proxy_workloads(&resources) {
        let id = resource.id();
        let pod = resource.pod_spec().expect("a workload");
        let own = &container["securityContext"];
        let pod_security = &pod["securityContext"];
        let either = |key: &str| own.get(key).unwrap_or(&pod_security[key]).clone();
        assert_eq!(either("runAsNonRoot").as_bool(), Some(true), "{id}");
        // The user the image runs as, so that the Secrets' files (fsGroup) are readable by the proxy in it.
        let (image_user, image_group) = image_user();
        assert_eq!(either("runAsUser").as_u64(), Some(image_user), "{id}");
        assert_eq!(either("runAsGroup").as_u64(), Some(image_group), "{id}");
        assert_eq!(either("fsGroup").as_u64(), Some(image_group), "{id}");
        assert_eq!(
            either("seccompProfile")["type"].as_str(),
            Some("RuntimeDefault"),
            "{id}"
        );
        assert_eq!(
            own["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{id}"
        );
        assert_eq!(own["readOnlyRootFilesystem"].as_bool(), Some(true), "{id}");
        assert!(
            seq(&own["capabilities"]["drop"]).iter().any(|c| c == "ALL"),
            "{id}: capabilities.drop must hold ALL"
        );
        assert!(
            seq(&own["capabilities"]["add"]).is_empty(),
            "{id}: the proxy needs no capability (its ports are above 1024)"
        );
        assert!(
            own.get("privileged")
                .is_none_or(|p| p.as_bool() == Some(false)),
            "{id}"
        );

        let resources = &container["resources"];
        for bound in ["requests", "limits"] {
            for what in ["cpu", "memory"] {
                assert!(
                    resources[bound].get(what).is_some(),
                    "{id}: resources.{bound}.{what} missing"
                );
            }
        }
        let memory_limit = bytes(
            resources["limits"]["memory"]
                .as_str()
                .expect("memory limit"),
        );
        let cache = u64::try_from(cli.config.range_cache_max_bytes).expect("fits");
        assert!(
            memory_limit >= cache + MEMORY_BEYOND_THE_CACHE,
            "{id}: a memory limit of {memory_limit} bytes leaves too little beside a range cache of up to {cache} \
             (--range-cache-max-bytes)"
        );
        if cli.worker_threads > 0 {
            let cores = millicores(&resources["limits"]["cpu"]);
            assert!(
                cores >= 1000 * u64::try_from(cli.worker_threads).expect("fits"),
                "{id}: a CPU limit of {cores}m throttles {} worker threads",
                cli.worker_threads
            );
        }

        // SIGTERM comes after preStop; the proxy then drains in-flight calls for up to `shutdown_grace`. A grace
        // period shorter than both would SIGKILL it mid-drain.
        let pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .unwrap_or(0);
        let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap_or(30);
        let drain = cli.config.shutdown_grace.as_secs();
        assert!(
            grace > pre_stop + drain,
            "{id}: terminationGracePeriodSeconds {grace} must exceed preStop {pre_stop} s + the proxy's {drain} s drain"
        );
    }
}

#[test]
fn the_deployment_registers_its_pod_ip_behind_a_service_and_a_disruption_budget() {
    let resources = manifests::all();
    let workloads = proxy_workloads(&resources);
    let (deployment, container, cli) = workloads
        .iter()
        .find(|(r, _, _)| r.kind() == "Deployment")
        .expect("a Deployment running the proxy");
    let id = deployment.id();
    let replicas = deployment.value["spec"]["replicas"].as_u64().unwrap_or(1);
    assert!(replicas >= 2, "{id}: {replicas} replicas");

    let resolver = cli.config.resolver.as_ref().unwrap_or_else(|| {
        panic!("{id}: no --resolver-prefix: the proxies are not registered in etcd")
    });
    assert!(resolver.ttl > 0);
    let advertise = cli.config.advertise.as_ref().expect("an advertise URL");
    let scheme = if cli.config.server_tls.is_some() {
        "https"
    } else {
        "http"
    };
    let port = cli.config.listen_addr.port();
    assert_eq!(
        advertise.url,
        format!("{scheme}://{POD_IP}:{port}"),
        "{id}: clients must reach each proxy at its own pod IP, on its client port, with its scheme"
    );

    let labels = deployment.pod_labels();
    let spread = &deployment.value["spec"]["template"]["spec"];
    let spread_over_nodes = seq(&spread["topologySpreadConstraints"]).iter().any(|c| {
        c["topologyKey"] == "kubernetes.io/hostname"
            && selects(&c["labelSelector"]["matchLabels"], labels)
    }) || spread["affinity"]["podAntiAffinity"].is_mapping();
    assert!(spread_over_nodes, "{id}: replicas may share a node");

    let same_file = |kind: &str| {
        resources
            .iter()
            .filter(|r| r.kind() == kind && r.file == deployment.file)
            .collect::<Vec<_>>()
    };
    let service = same_file("Service")
        .into_iter()
        .find(|s| selects(&s.value["spec"]["selector"], labels))
        .unwrap_or_else(|| panic!("{id}: no Service selects its pods"));
    let client_port = seq(&service.value["spec"]["ports"])
        .iter()
        .map(|p| port_number(p.get("targetPort").unwrap_or(&p["port"]), container))
        .collect::<Vec<_>>();
    assert!(
        client_port.contains(&port),
        "{}: no port reaches the proxy's client port {port}: {client_port:?}",
        service.id()
    );
    let budget = same_file("PodDisruptionBudget")
        .into_iter()
        .find(|b| selects(&b.value["spec"]["selector"]["matchLabels"], labels))
        .unwrap_or_else(|| panic!("{id}: no PodDisruptionBudget selects its pods"));
    let spec = &budget.value["spec"];
    assert!(
        spec.get("maxUnavailable").is_some() || spec.get("minAvailable").is_some(),
        "{}",
        budget.id()
    );
}

#[test]
fn the_daemonset_serves_node_local_clients_on_the_nodes_loopback() {
    let resources = manifests::all();
    let workloads = proxy_workloads(&resources);
    let (daemonset, _, cli) = workloads
        .iter()
        .find(|(r, _, _)| r.kind() == "DaemonSet")
        .expect("a DaemonSet running the proxy");
    let id = daemonset.id();
    let spec = daemonset.pod_spec().expect("a workload");
    assert_eq!(spec["hostNetwork"].as_bool(), Some(true), "{id}");
    // Without it, a pod on the host's network cannot resolve cluster DNS names such as the etcd endpoints'.
    assert_eq!(
        spec["dnsPolicy"].as_str(),
        Some("ClusterFirstWithHostNet"),
        "{id}"
    );
    assert!(
        cli.config.listen_addr.ip().is_loopback(),
        "{id}: listens on {}: off the node's loopback, any host could reach it",
        cli.config.listen_addr
    );
    assert!(
        cli.config
            .metrics_listen
            .as_ref()
            .is_none_or(|m| m.addr.ip().is_loopback()),
        "{id}: --metrics-addr off the node's loopback"
    );
}

/// Where the manifests mount their Secrets; the live test puts its certificates under a temp dir in their place.
const MOUNT_ROOT: &str = "/etc/etcd-grpc-proxy/";

/// A hang guard for each wait of the live test.
const WAIT: Duration = Duration::from_secs(60);

/// The test's certificates, written under the Secrets' key names (deploy/kubernetes/README.md): `etcd/` holds the
/// proxy's client certificate towards etcd and etcd's CA, `server/` the proxy's own certificate and its clients' CA.
struct Secrets {
    root: tempfile::TempDir,
    etcd: testkit::etcd::EtcdTls,
    /// A client of the proxy, with a certificate from the clients' CA.
    client: TlsPaths,
}

impl Secrets {
    fn new() -> Self {
        let root = testkit::dirs::temp_dir("deploy-kubernetes-").expect("temp dir");
        let work = root.path().join("ca");
        std::fs::create_dir(&work).expect("mkdir");
        let etcd_ca = Ca::new("etcd-ca").expect("etcd CA");
        let proxy_ca = Ca::new("proxy-ca").expect("proxy CA");
        let party = |ca: &Ca, name: &str, leaf: Leaf| {
            ca.write_party(&work, name, &leaf)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let etcd = testkit::etcd::EtcdTls {
            server: party(&etcd_ca, "etcd-server", Leaf::server().client_auth()),
            client_cert_auth: true,
            client: party(&etcd_ca, "kit", Leaf::client(None)),
        };
        // As the Secrets hold them: the proxy's certificate must serve and, for /proxy/health, be a client's too.
        for (dir, party) in [
            (
                "etcd",
                party(&etcd_ca, "proxy-upstream", Leaf::client(None)),
            ),
            (
                "server",
                party(&proxy_ca, "proxy-server", Leaf::server().client_auth()),
            ),
        ] {
            let dir = root.path().join(dir);
            std::fs::create_dir(&dir).expect("mkdir");
            for (key, file) in [
                ("ca.crt", &party.ca),
                ("tls.crt", &party.cert),
                ("tls.key", &party.key),
            ] {
                std::fs::copy(file, dir.join(key)).expect("copy a certificate");
            }
        }
        let client = party(&proxy_ca, "client", Leaf::client(None));
        Self { root, etcd, client }
    }
}

/// `args` as this test runs them on loopback: TLS files from `secrets`, `--metrics-addr` on `metrics_port`, and
/// without `--endpoints` and `--listen-addr`, which `ProxyProcess` gives.
fn local_args(args: &[String], secrets: &Secrets, metrics_port: u16) -> Vec<String> {
    let root = format!("{}/", secrets.root.path().display());
    args.iter()
        .filter(|a| !a.starts_with("--endpoints=") && !a.starts_with("--listen-addr="))
        .map(|a| match a.strip_prefix("--metrics-addr=") {
            Some(url) => {
                let scheme = url.split_once("://").expect("a URL").0;
                format!("--metrics-addr={scheme}://127.0.0.1:{metrics_port}")
            }
            None => a.replace(MOUNT_ROOT, &root),
        })
        .collect()
}

/// `GET path` on the probe's port, as the kubelet asks: status code, or the error.
async fn probe_get(probe: &Value, addr: &str) -> Result<u16, String> {
    let path = probe["httpGet"]["path"].as_str().expect("an httpGet probe");
    testkit::http::get(addr, path).await.map(|(code, _)| code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_manifests_args_readiness_follows_etcd_and_liveness_outlives_it() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let resources = manifests::all();
    for (resource, container, cli) in proxy_workloads(&resources) {
        let id = resource.id();
        let secrets = Secrets::new();
        let mut etcd = EtcdCluster::start_tls(&binaries, 1, &[], &secrets.etcd)
            .await
            .unwrap_or_else(|e| panic!("start etcd with TLS: {e}"));
        let metrics_port = testkit::ports::free_port();
        let flags = local_args(&expanded_args(container), &secrets, metrics_port);
        let tls = cli
            .config
            .server_tls
            .is_some()
            .then(|| secrets.client.clone());
        let proxy =
            ProxyProcess::start_with(Path::new(PROXY_BIN), &etcd.endpoints(), &flags, &[], tls)
                .await
                .unwrap_or_else(|e| panic!("{id}: start the proxy with {flags:?}: {e}"));
        // The manifest's ports, as this test moved them.
        let local = |probe: &Value| {
            let port = port_number(&probe["httpGet"]["port"], container);
            if port == cli.config.listen_addr.port() {
                proxy.addr()
            } else {
                assert_eq!(
                    Some(port),
                    cli.config.metrics_listen.as_ref().map(|m| m.addr.port()),
                    "{id}"
                );
                format!("127.0.0.1:{metrics_port}")
            }
        };
        let readiness = &container["readinessProbe"];
        let liveness = &container["livenessProbe"];
        let (ready_at, live_at) = (local(readiness), local(liveness));
        wait_for(&format!("{id}: ready"), WAIT, || async {
            match probe_get(readiness, &ready_at).await? {
                200 => Ok(()),
                code => Err(format!("readiness {code}")),
            }
        })
        .await;
        assert_eq!(probe_get(liveness, &live_at).await, Ok(200), "{id}");

        etcd.kill(0);
        wait_for(&format!("{id}: not ready without etcd"), WAIT, || async {
            match probe_get(readiness, &ready_at).await? {
                503 => Ok(()),
                code => Err(format!("readiness {code}")),
            }
        })
        .await;
        assert_eq!(
            probe_get(liveness, &live_at).await,
            Ok(200),
            "{id}: the liveness probe fails while etcd is down: the kubelet would restart the proxy"
        );
    }
}
