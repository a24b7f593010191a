//! Go's names for TLS versions and cipher suites, as `--tls-min-version`, `--tls-max-version` and
//! `--listen-cipher-suites` take them, mapped onto what rustls has.
//!
//! As in Go, the cipher suite list governs TLS 1.2 only; TLS 1.3's suites are always on. rustls offers only AEAD
//! suites with forward secrecy, so Go's CBC, RC4, 3DES and RSA key exchange suites are refused by name.

use rustls::{CipherSuite, SupportedCipherSuite, SupportedProtocolVersion};

use super::TlsError;

/// A TLS version flag's value.
pub fn version(flag: &str, value: &str) -> Result<&'static SupportedProtocolVersion, TlsError> {
    match value {
        "TLS1.2" => Ok(&rustls::version::TLS12),
        "TLS1.3" => Ok(&rustls::version::TLS13),
        "TLS1.0" | "TLS1.1" => Err(TlsError(format!(
            "--{flag}={value} is not supported: TLS 1.0 and 1.1 are obsolete and rustls implements TLS 1.2 and 1.3 only"
        ))),
        _ => Err(TlsError(format!(
            "--{flag}: unexpected TLS version {value:?} (supported: TLS1.2, TLS1.3)"
        ))),
    }
}

/// The TLS versions from `--tls-min-version` to `--tls-max-version` (empty: the newest).
pub fn versions(min: &str, max: &str) -> Result<Vec<&'static SupportedProtocolVersion>, TlsError> {
    let low = version("tls-min-version", min)?;
    let high = if max.is_empty() {
        &rustls::version::TLS13
    } else {
        version("tls-max-version", max)?
    };
    let order = |v: &SupportedProtocolVersion| u16::from(v.version);
    if order(low) > order(high) {
        return Err(TlsError(format!(
            "min version ({min}) is greater than max version ({max})"
        )));
    }
    Ok([&rustls::version::TLS12, &rustls::version::TLS13]
        .into_iter()
        .filter(|v| (order(low)..=order(high)).contains(&order(v)))
        .collect())
}

/// Go's name of every TLS 1.2 suite rustls has.
const SUPPORTED: &[(&str, CipherSuite)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// TLS 1.3 suites Go names: accepted, and always on (Go does not let them be configured either).
const TLS13: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// Suites Go knows that rustls does not implement.
const LACKING: &[&str] = &[
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// The provider's suites allowed by `--listen-cipher-suites` (comma-separated Go names; empty: all of them).
pub fn cipher_suites(
    list: &[String],
    all: &[SupportedCipherSuite],
) -> Result<Vec<SupportedCipherSuite>, TlsError> {
    if list.is_empty() {
        return Ok(all.to_vec());
    }
    let mut chosen = Vec::new();
    for name in list {
        let name = name.trim();
        if let Some((_, suite)) = SUPPORTED.iter().find(|(go, _)| *go == name) {
            chosen.push(*suite);
        } else if TLS13.contains(&name) {
        } else if LACKING.contains(&name) {
            return Err(TlsError(format!(
                "--listen-cipher-suites: {name} is not supported by etcd-grpc-proxy: rustls implements only AEAD suites with ECDHE key exchange (supported: {})",
                SUPPORTED
                    .iter()
                    .map(|(go, _)| *go)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        } else {
            return Err(TlsError(format!(
                "--listen-cipher-suites: unexpected TLS cipher suite {name:?}"
            )));
        }
    }
    Ok(all
        .iter()
        .filter(|s| match s {
            SupportedCipherSuite::Tls12(_) => chosen.contains(&s.suite()),
            SupportedCipherSuite::Tls13(_) => true,
        })
        .copied()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn go_names_choose_tls12_suites_and_tls13_stays_on() {
        let all = super::super::provider().cipher_suites.clone();
        let chosen =
            cipher_suites(&names(&["TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305"]), &all).unwrap();
        let tls12: Vec<_> = chosen
            .iter()
            .filter(|s| matches!(s, SupportedCipherSuite::Tls12(_)))
            .map(|s| s.suite())
            .collect();
        assert_eq!(
            tls12,
            [CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256]
        );
        assert_eq!(
            chosen.len() - tls12.len(),
            all.iter()
                .filter(|s| matches!(s, SupportedCipherSuite::Tls13(_)))
                .count()
        );
        assert_eq!(cipher_suites(&[], &all).unwrap().len(), all.len());
    }

    #[test]
    fn suites_rustls_lacks_and_unknown_names_are_refused_by_name() {
        let all = super::super::provider().cipher_suites.clone();
        let err = cipher_suites(&names(&["TLS_RSA_WITH_AES_128_CBC_SHA"]), &all).unwrap_err();
        assert!(
            err.0
                .contains("TLS_RSA_WITH_AES_128_CBC_SHA is not supported"),
            "{err}"
        );
        let err = cipher_suites(&names(&["NOPE"]), &all).unwrap_err();
        assert!(
            err.0.contains("unexpected TLS cipher suite \"NOPE\""),
            "{err}"
        );
    }

    #[test]
    fn versions_span_min_to_max_and_old_ones_are_refused() {
        assert_eq!(versions("TLS1.2", "").unwrap().len(), 2);
        assert_eq!(versions("TLS1.3", "").unwrap(), [&rustls::version::TLS13]);
        assert_eq!(
            versions("TLS1.2", "TLS1.2").unwrap(),
            [&rustls::version::TLS12]
        );
        assert!(
            versions("TLS1.3", "TLS1.2")
                .unwrap_err()
                .0
                .contains("greater than max")
        );
        assert!(
            versions("TLS1.1", "")
                .unwrap_err()
                .0
                .contains("not supported")
        );
        assert!(
            versions("SSL3", "")
                .unwrap_err()
                .0
                .contains("unexpected TLS version")
        );
    }
}
