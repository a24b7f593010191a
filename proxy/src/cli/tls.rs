//! The TLS flags of `etcd grpc-proxy start` (towards etcd, towards clients) and `--metrics-addr`, checked against
//! each other the way etcd checks them, and stricter where etcd silently ignores a flag: a flag that would change
//! nothing is refused with the reason.

use std::path::PathBuf;

use clap::Args;

use crate::config::{Config, MetricsListen, Scheme};
use crate::tls::server::{Certificate, HANDSHAKE_TIMEOUT};
use crate::tls::{ClientSettings, ServerSettings, suites};

#[derive(Args, Debug)]
pub struct TlsArgs {
    /// Certificate the proxy presents to etcd (PEM); it must have no Common Name (see --allow-cert-common-name)
    #[arg(long, default_value = "")]
    cert: String,
    /// Private key of --cert (PEM)
    #[arg(long, default_value = "")]
    key: String,
    /// CA bundle that etcd's certificates must chain to (PEM; default: the system's CAs)
    #[arg(long, default_value = "")]
    cacert: String,
    /// Do not verify etcd's certificate
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    insecure_skip_tls_verify: bool,
    /// Accept a --cert with a Common Name: with --client-cert-auth, etcd then runs every request without a token as
    /// that user, so every client of the proxy gets its rights
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    allow_cert_common_name: bool,
    /// Certificate the proxy presents to its clients (PEM)
    #[arg(long, default_value = "")]
    cert_file: String,
    /// Private key of --cert-file (PEM)
    #[arg(long, default_value = "")]
    key_file: String,
    /// CA bundle that clients' certificates must chain to; clients must present one
    #[arg(long, default_value = "")]
    trusted_ca_file: String,
    /// CRL: client certificates it revokes are refused
    #[arg(long, default_value = "")]
    client_crl_file: String,
    /// Serve clients with a self-signed certificate kept under <data-dir>/fixtures/proxy
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    auto_tls: bool,
    /// Validity of the --auto-tls certificate, in years
    #[arg(long, default_value_t = 1)]
    self_signed_cert_validity: u32,
    /// Comma-separated TLS 1.2 cipher suites for clients, by Go's names (TLS 1.3's are always on)
    #[arg(long, default_value = "")]
    listen_cipher_suites: String,
    /// Oldest TLS version clients may use (TLS1.2 or TLS1.3)
    #[arg(long, default_value = "TLS1.2")]
    tls_min_version: String,
    /// Newest TLS version clients may use (default: TLS1.3)
    #[arg(long, default_value = "")]
    tls_max_version: String,
    /// Also serve /metrics and /health on this URL (http://host:port, or https:// with the clients' TLS)
    #[arg(long, default_value = "")]
    metrics_addr: String,
    /// Directory of the --auto-tls certificate
    #[arg(long, default_value = "default.proxy")]
    data_dir: PathBuf,
}

/// Sets the TLS and metrics listener parts of `config` from the flags.
pub fn apply(args: TlsArgs, config: &mut Config) -> Result<(), String> {
    config.upstream_tls = upstream(&args, config)?;
    config.server_tls = listener(&args, config)?;
    if !args.metrics_addr.is_empty() {
        let metrics = MetricsListen::parse(&args.metrics_addr)?;
        if metrics.tls && config.server_tls.is_none() {
            return Err(
                "--metrics-addr https:// serves with the clients' TLS: give --cert-file and --key-file, or --auto-tls"
                    .into(),
            );
        }
        config.metrics_listen = Some(metrics);
    }
    Ok(())
}

fn path(value: &str) -> Option<PathBuf> {
    (!value.is_empty()).then(|| PathBuf::from(value))
}

fn upstream(args: &TlsArgs, config: &Config) -> Result<Option<ClientSettings>, String> {
    let identity = match (path(&args.cert), path(&args.key)) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err("--cert and --key must be given together".into()),
    };
    let settings = ClientSettings {
        ca: path(&args.cacert),
        identity,
        insecure_skip_verify: args.insecure_skip_tls_verify,
        allow_common_name: args.allow_cert_common_name,
    };
    let flags_given =
        settings.ca.is_some() || settings.identity.is_some() || settings.insecure_skip_verify;
    let schemes = || config.endpoints.iter().map(|e| e.scheme());
    let any_https = schemes().any(|s| s == Scheme::Https);
    let tls = flags_given || any_https;
    if tls && let Some(plain) = config.endpoints.iter().find(|e| e.scheme() == Scheme::Http) {
        let why = if any_https {
            "--endpoints mixes http:// and https://"
        } else {
            "TLS towards etcd is configured (--cacert, --cert, --key or --insecure-skip-tls-verify)"
        };
        return Err(format!(
            "{why}, but endpoint http://{plain} is plaintext: write every endpoint with https:// (or as host:port), or drop the TLS flags"
        ));
    }
    if settings.allow_common_name && settings.identity.is_none() {
        return Err("--allow-cert-common-name needs --cert".into());
    }
    Ok(tls.then_some(settings))
}

fn listener(args: &TlsArgs, config: &Config) -> Result<Option<ServerSettings>, String> {
    let certificate = match (path(&args.cert_file), path(&args.key_file), args.auto_tls) {
        (Some(_), Some(_), true) => {
            return Err("--auto-tls and --cert-file/--key-file are exclusive: choose one".into());
        }
        (Some(cert), Some(key), false) => Some(Certificate::Files { cert, key }),
        (None, None, true) => {
            if args.self_signed_cert_validity == 0 {
                return Err(
                    "--self-signed-cert-validity must be greater than 0 with --auto-tls".into(),
                );
            }
            Some(Certificate::Auto {
                dir: args.data_dir.join("fixtures").join("proxy"),
                validity_years: args.self_signed_cert_validity,
                host: config.listen_addr.ip().to_string(),
            })
        }
        (None, None, false) => None,
        _ => return Err("--cert-file and --key-file must be given together".into()),
    };
    let Some(certificate) = certificate else {
        for (flag, value, default) in [
            ("trusted-ca-file", args.trusted_ca_file.as_str(), ""),
            ("client-crl-file", &args.client_crl_file, ""),
            ("listen-cipher-suites", &args.listen_cipher_suites, ""),
            ("tls-min-version", &args.tls_min_version, "TLS1.2"),
            ("tls-max-version", &args.tls_max_version, ""),
        ] {
            if value != default {
                return Err(format!(
                    "--{flag} applies to TLS towards clients, which is off: give --cert-file and --key-file, or --auto-tls"
                ));
            }
        }
        return Ok(None);
    };
    let versions =
        suites::versions(&args.tls_min_version, &args.tls_max_version).map_err(|e| e.0)?;
    let names: Vec<String> = args
        .listen_cipher_suites
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect();
    if !names.is_empty() && args.tls_min_version == "TLS1.3" {
        return Err("--listen-cipher-suites cannot be set with --tls-min-version=TLS1.3: TLS 1.3's suites are not configurable".into());
    }
    let cipher_suites =
        suites::cipher_suites(&names, &crate::tls::provider().cipher_suites).map_err(|e| e.0)?;
    let trusted_ca = path(&args.trusted_ca_file);
    let crl = path(&args.client_crl_file);
    if crl.is_some() && trusted_ca.is_none() {
        return Err(
            "--client-crl-file needs --trusted-ca-file: without it clients present no certificate to check".into(),
        );
    }
    Ok(Some(ServerSettings {
        certificate,
        trusted_ca,
        crl,
        cipher_suites,
        versions,
        handshake_timeout: HANDSHAKE_TIMEOUT,
    }))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(args: &[&str]) -> Result<Config, String> {
        super::super::parse(
            ["etcd-grpc-proxy", "start"]
                .into_iter()
                .chain(args.iter().copied()),
            || 7,
        )
        .map(|cli| cli.config)
        .map_err(|e| e.to_string())
    }

    fn refused(args: &[&str], reason: &str) {
        let err = parse(args).unwrap_err();
        assert!(err.contains(reason), "{args:?}: {err}");
    }

    #[test]
    fn tls_towards_etcd_follows_the_endpoints_scheme_and_the_flags() {
        assert!(parse(&[]).unwrap().upstream_tls.is_none());
        assert!(
            parse(&["--endpoints=https://127.0.0.1:2379"])
                .unwrap()
                .upstream_tls
                .is_some()
        );
        // A bare host:port takes TLS from the flags, as clientv3 does.
        let config = parse(&["--endpoints=127.0.0.1:2379", "--cacert=ca.pem"]).unwrap();
        assert_eq!(
            config.upstream_tls.unwrap().ca.unwrap(),
            std::path::PathBuf::from("ca.pem")
        );
        refused(
            &["--endpoints=https://127.0.0.1:1,http://127.0.0.1:2"],
            "mixes http:// and https://",
        );
        refused(
            &[
                "--endpoints=http://127.0.0.1:1",
                "--insecure-skip-tls-verify",
            ],
            "is plaintext",
        );
        refused(&["--cert=c.pem"], "--cert and --key must be given together");
        refused(&["--allow-cert-common-name"], "needs --cert");
    }

    #[test]
    fn client_facing_flags_need_client_facing_tls() {
        let config = parse(&[
            "--cert-file=s.pem",
            "--key-file=k.pem",
            "--trusted-ca-file=ca.pem",
        ])
        .unwrap();
        let tls = config.server_tls.unwrap();
        assert!(tls.trusted_ca.is_some());
        assert_eq!(tls.versions.len(), 2);
        for flag in [
            "--trusted-ca-file=ca.pem",
            "--client-crl-file=crl.pem",
            "--listen-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "--tls-min-version=TLS1.3",
            "--tls-max-version=TLS1.2",
        ] {
            refused(&[flag], "TLS towards clients, which is off");
        }
        refused(&["--cert-file=s.pem"], "must be given together");
        refused(
            &["--auto-tls", "--cert-file=s.pem", "--key-file=k.pem"],
            "exclusive",
        );
        refused(
            &["--auto-tls", "--self-signed-cert-validity=0"],
            "greater than 0",
        );
        refused(
            &["--auto-tls", "--client-crl-file=crl.pem"],
            "--client-crl-file needs --trusted-ca-file",
        );
        refused(
            &[
                "--auto-tls",
                "--tls-min-version=TLS1.3",
                "--listen-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            ],
            "cannot be set with --tls-min-version=TLS1.3",
        );
        refused(&["--auto-tls", "--tls-min-version=TLS1.1"], "not supported");
        refused(
            &[
                "--auto-tls",
                "--listen-cipher-suites=TLS_RSA_WITH_RC4_128_SHA",
            ],
            "is not supported",
        );
    }

    #[test]
    fn auto_tls_keeps_its_files_under_the_data_dir() {
        let config = parse(&[
            "--auto-tls",
            "--data-dir=/var/lib/p",
            "--listen-addr=127.0.0.2:1",
        ])
        .unwrap();
        match config.server_tls.unwrap().certificate {
            crate::tls::server::Certificate::Auto {
                dir,
                host,
                validity_years,
            } => {
                assert_eq!(dir, std::path::PathBuf::from("/var/lib/p/fixtures/proxy"));
                assert_eq!(host, "127.0.0.2");
                assert_eq!(validity_years, 1);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn metrics_addr_takes_http_and_https_urls() {
        let config = parse(&["--metrics-addr=http://127.0.0.1:9000"]).unwrap();
        let metrics = config.metrics_listen.unwrap();
        assert_eq!(
            (metrics.addr, metrics.tls),
            ("127.0.0.1:9000".parse().unwrap(), false)
        );
        refused(
            &["--metrics-addr=https://127.0.0.1:9000"],
            "serves with the clients' TLS",
        );
        let config = parse(&["--metrics-addr=https://localhost:9000", "--auto-tls"]).unwrap();
        assert!(config.metrics_listen.unwrap().tls);
        refused(
            &["--metrics-addr=127.0.0.1:9000"],
            "expected http://host:port",
        );
    }
}
