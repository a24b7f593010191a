//! Certificates made for tests, in this process, with `rcgen`: a self-signed [`Ca`] that issues server and client
//! certificates ([`Leaf`]: names, Common Name or none, validity, key algorithm) and CRLs, and PEM files of them
//! written (and replaced, for rotation) atomically.
//!
//! etcd's `--client-cert-auth` takes a client certificate's Common Name as the user name when a request carries no
//! token; a proxy's certificate towards etcd must therefore have none ([`Leaf::client`] with `None`). etcd's
//! `--auto-tls` makes ECDSA P-521 certificates, hence [`KeyAlg::P521`]. Server certificates name `127.0.0.1` (an IP
//! SAN) and `localhost` (a DNS SAN), where every server of the kit listens.
//!
//! A CN-less certificate still has a subject: `O=<purpose>`, so that its subject is never empty.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevokedCertParams, SerialNumber, SignatureAlgorithm,
};

/// A day, the unit of the validity windows below.
const DAY: Duration = Duration::from_secs(24 * 3600);

/// The key algorithm of a certificate (and the signature algorithm of a CA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyAlg {
    /// ECDSA on P-256 with SHA-256: the default.
    P256,
    /// ECDSA on P-384 with SHA-384.
    P384,
    /// ECDSA on P-521 with SHA-512, as etcd's `--auto-tls` makes them (ring lacks it; aws-lc-rs has it).
    P521,
    /// Ed25519.
    Ed25519,
}

impl KeyAlg {
    fn rcgen(self) -> &'static SignatureAlgorithm {
        match self {
            KeyAlg::P256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            KeyAlg::P384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            KeyAlg::P521 => &rcgen::PKCS_ECDSA_P521_SHA512,
            KeyAlg::Ed25519 => &rcgen::PKCS_ED25519,
        }
    }

    fn key_pair(self) -> Result<KeyPair, String> {
        KeyPair::generate_for(self.rcgen()).map_err(|e| format!("generate a {self:?} key: {e}"))
    }
}

/// The wall clock, which is what the TLS stacks of etcd, etcdctl and the proxy check certificates against.
#[allow(clippy::disallowed_methods)]
fn now() -> SystemTime {
    SystemTime::now()
}

/// How long after the Unix epoch `t` is (rcgen's dates are built as the epoch plus this, so the `time` crate
/// behind them is never named here).
fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// The date rcgen writes for `t`.
macro_rules! date {
    ($t:expr) => {
        rcgen::date_time_ymd(1970, 1, 1) + since_epoch($t)
    };
}

/// What a certificate is for: its names, subject, usages, validity and key. Built from [`Leaf::server`] or
/// [`Leaf::client`] and adjusted; a [`Ca`] issues it.
#[derive(Clone, Debug)]
pub struct Leaf {
    common_name: Option<String>,
    organization: String,
    names: Vec<String>,
    server_auth: bool,
    client_auth: bool,
    alg: KeyAlg,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl Leaf {
    fn new(organization: &str) -> Leaf {
        let now = now();
        Leaf {
            common_name: None,
            organization: organization.to_string(),
            names: Vec::new(),
            server_auth: false,
            client_auth: false,
            alg: KeyAlg::P256,
            // An hour back, so that a clock a little behind ours still accepts it.
            not_before: now - Duration::from_secs(3600),
            not_after: now + 365 * DAY,
        }
    }

    /// A server certificate (extended key usage serverAuth) for `127.0.0.1` (IP SAN) and `localhost` (DNS SAN),
    /// without a Common Name, valid from an hour ago for a year, P-256.
    pub fn server() -> Leaf {
        let mut leaf = Leaf::new("testkit server");
        leaf.server_auth = true;
        leaf.names = vec!["127.0.0.1".into(), "localhost".into()];
        leaf
    }

    /// A client certificate (extended key usage clientAuth) with Common Name `cn`, or none (then etcd's
    /// `--client-cert-auth` maps it to no user), without SANs, valid from an hour ago for a year, P-256.
    pub fn client(cn: Option<&str>) -> Leaf {
        let mut leaf = Leaf::new("testkit client");
        leaf.client_auth = true;
        leaf.common_name = cn.map(str::to_string);
        leaf
    }

    /// Also a name it is valid for: an IP SAN if `name` parses as an IP address, a DNS SAN otherwise.
    pub fn name(mut self, name: &str) -> Leaf {
        self.names.push(name.to_string());
        self
    }

    /// Its Common Name (`None`: none).
    pub fn common_name(mut self, cn: Option<&str>) -> Leaf {
        self.common_name = cn.map(str::to_string);
        self
    }

    /// Usable for servers too (extended key usage serverAuth): etcd's own certificate with `--client-cert-auth`
    /// serves clients and is presented by its gateway as a client, so it needs both.
    pub fn server_auth(mut self) -> Leaf {
        self.server_auth = true;
        self
    }

    /// Usable for clients too (extended key usage clientAuth).
    pub fn client_auth(mut self) -> Leaf {
        self.client_auth = true;
        self
    }

    /// Its key algorithm.
    pub fn alg(mut self, alg: KeyAlg) -> Leaf {
        self.alg = alg;
        self
    }

    /// Valid from `not_before` until `not_after`.
    pub fn valid(mut self, not_before: SystemTime, not_after: SystemTime) -> Leaf {
        self.not_before = not_before;
        self.not_after = not_after;
        self
    }

    /// Expired: valid from two days ago until yesterday.
    pub fn expired(self) -> Leaf {
        let now = now();
        self.valid(now - 2 * DAY, now - DAY)
    }

    /// Not valid yet: valid from tomorrow for a year.
    pub fn not_yet_valid(self) -> Leaf {
        let now = now();
        self.valid(now + DAY, now + 365 * DAY)
    }
}

/// A certificate a [`Ca`] issued, with its private key.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// Its private key, PKCS#8 PEM.
    pub key_pem: String,
    /// Its serial number (what a CRL lists).
    pub serial: u64,
    cert_der: Vec<u8>,
}

impl Issued {
    /// The certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// Writes (or atomically replaces) `<name>.pem` and `<name>-key.pem` in `dir`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str) -> io::Result<(PathBuf, PathBuf)> {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}-key.pem"));
        replace(&cert, &self.cert_pem)?;
        replace(&key, &self.key_pem)?;
        Ok((cert, key))
    }
}

/// The files one side of a TLS connection needs: the CA it verifies its peer with, and its own certificate and
/// key (for a server, `ca` verifies client certificates; for a client, the server's).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TlsPaths {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A self-signed certificate authority that issues [`Leaf`] certificates and CRLs.
pub struct Ca {
    name: String,
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    cert_der: Vec<u8>,
    next_serial: AtomicU64,
    next_crl: AtomicU64,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("name", &self.name).finish()
    }
}

impl Ca {
    /// A CA named `name` (its subject's Common Name) with an ECDSA P-256 key, valid from a day ago for ten years.
    pub fn new(name: &str) -> Result<Ca, String> {
        Ca::with_alg(name, KeyAlg::P256)
    }

    /// A CA with a key of `alg` (which is also what it signs with).
    pub fn with_alg(name: &str, alg: KeyAlg) -> Result<Ca, String> {
        let key = alg.key_pair()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        dn.push(DnType::OrganizationName, "testkit");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = now();
        params.not_before = date!(now - DAY);
        params.not_after = date!(now + 3650 * DAY);
        params.serial_number = Some(SerialNumber::from(1u64));
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("self-sign CA {name}: {e}"))?;
        Ok(Ca {
            name: name.to_string(),
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            issuer: Issuer::new(params, key),
            next_serial: AtomicU64::new(1000),
            next_crl: AtomicU64::new(1),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Its certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// Issues `leaf`, signed by this CA, with a serial number of its own.
    pub fn issue(&self, leaf: &Leaf) -> Result<Issued, String> {
        let key = leaf.alg.key_pair()?;
        let mut params = CertificateParams::new(leaf.names.clone())
            .map_err(|e| format!("names {:?}: {e}", leaf.names))?;
        let mut dn = DistinguishedName::new();
        if let Some(cn) = &leaf.common_name {
            dn.push(DnType::CommonName, cn.as_str());
        }
        dn.push(DnType::OrganizationName, leaf.organization.as_str());
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = [
            (leaf.server_auth, ExtendedKeyUsagePurpose::ServerAuth),
            (leaf.client_auth, ExtendedKeyUsagePurpose::ClientAuth),
        ]
        .into_iter()
        .filter_map(|(on, eku)| on.then_some(eku))
        .collect();
        params.use_authority_key_identifier_extension = true;
        params.not_before = date!(leaf.not_before);
        params.not_after = date!(leaf.not_after);
        let serial = self.next_serial.fetch_add(1, Ordering::SeqCst);
        params.serial_number = Some(SerialNumber::from(serial));
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| format!("CA {} signing a certificate: {e}", self.name))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            serial,
            cert_der: cert.der().to_vec(),
        })
    }

    /// [`Leaf::server`]: for `127.0.0.1` and `localhost`.
    pub fn server(&self) -> Result<Issued, String> {
        self.issue(&Leaf::server())
    }

    /// [`Leaf::client`] with Common Name `cn` or none.
    pub fn client(&self, cn: Option<&str>) -> Result<Issued, String> {
        self.issue(&Leaf::client(cn))
    }

    /// A CRL of this CA revoking the certificates with `serials` (as of an hour ago), issued an hour ago and due
    /// for renewal in a week; PEM. Each CRL gets the next CRL number.
    pub fn crl(&self, serials: &[u64]) -> Result<String, String> {
        let now = now();
        let hour_ago = now - Duration::from_secs(3600);
        let params = CertificateRevocationListParams {
            this_update: date!(hour_ago),
            next_update: date!(now + 7 * DAY),
            crl_number: SerialNumber::from(self.next_crl.fetch_add(1, Ordering::SeqCst)),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|&s| RevokedCertParams {
                    serial_number: SerialNumber::from(s),
                    revocation_time: date!(hour_ago),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        params
            .signed_by(&self.issuer)
            .and_then(|crl| crl.pem())
            .map_err(|e| format!("CA {} signing a CRL: {e}", self.name))
    }

    /// Writes (or atomically replaces) its certificate as `<name>.pem` in `dir`; returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> io::Result<PathBuf> {
        let path = dir.join(format!("{name}.pem"));
        replace(&path, &self.cert_pem)?;
        Ok(path)
    }

    /// Writes (or atomically replaces) a CRL ([`Ca::crl`]) revoking `serials` as `<name>.pem` in `dir`.
    pub fn write_crl(&self, dir: &Path, name: &str, serials: &[u64]) -> io::Result<PathBuf> {
        let pem = self.crl(serials).map_err(io::Error::other)?;
        let path = dir.join(format!("{name}.pem"));
        replace(&path, &pem)?;
        Ok(path)
    }

    /// Issues `leaf` and writes what one TLS party needs into `dir`: `<name>.pem`, `<name>-key.pem` and this CA
    /// as `<name>-ca.pem` (the CA its peers' certificates are checked against, when they come from this CA too).
    pub fn write_party(&self, dir: &Path, name: &str, leaf: &Leaf) -> Result<TlsPaths, String> {
        let issued = self.issue(leaf)?;
        let (cert, key) = issued
            .write(dir, name)
            .map_err(|e| format!("write {name}: {e}"))?;
        let ca = self
            .write(dir, &format!("{name}-ca"))
            .map_err(|e| format!("write {name}-ca: {e}"))?;
        Ok(TlsPaths { ca, cert, key })
    }
}

/// Replaces `path` with `contents` atomically: written to a temporary file in the same directory, then renamed
/// over it, so a reader (a server reloading its certificate) sees the old file or the new one, never a part.
pub fn replace(path: &Path, contents: &str) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} names no file", path.display())))?;
    let tmp = dir.join(format!(
        ".{}.{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// A rustls client configuration (aws-lc-rs, so P-521 works) that trusts `tls.ca` only and presents `tls.cert`
/// with `tls.key`; the files are read now.
pub fn client_config(tls: &TlsPaths) -> Result<rustls::ClientConfig, String> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&tls.ca)
        .map_err(|e| format!("read CA {}: {e}", tls.ca.display()))?
    {
        let cert = cert.map_err(|e| format!("parse CA {}: {e}", tls.ca.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("CA {}: {e}", tls.ca.display()))?;
    }
    let chain = CertificateDer::pem_file_iter(&tls.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("read certificate {}: {e}", tls.cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&tls.key)
        .map_err(|e| format!("read key {}: {e}", tls.key.display()))?;
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| format!("client certificate {}: {e}", tls.cert.display()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use x509_parser::certificate::X509Certificate;
    use x509_parser::extensions::GeneralName;
    use x509_parser::prelude::FromDer;

    use super::*;

    fn parse(der: &[u8]) -> X509Certificate<'_> {
        X509Certificate::from_der(der).expect("DER parses").1
    }

    /// The certificate inside a PEM text, as DER.
    fn pem_der(pem: &str) -> Vec<u8> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("PEM parses");
        pem.contents
    }

    fn common_names(cert: &X509Certificate<'_>) -> Vec<String> {
        cert.subject()
            .iter_common_name()
            .map(|a| a.as_str().expect("UTF-8 CN").to_string())
            .collect()
    }

    fn key_bits(cert: &X509Certificate<'_>) -> usize {
        cert.public_key().parsed().expect("public key").key_size()
    }

    #[test]
    fn a_server_certificate_names_loopback_by_ip_and_by_name_and_the_ca_issued_it() {
        let ca = Ca::new("testkit-unit-ca").unwrap();
        let ca_der = pem_der(ca.cert_pem());
        assert_eq!(ca_der, ca.cert_der());
        let ca_cert = parse(&ca_der);
        assert!(ca_cert.is_ca());
        assert_eq!(common_names(&ca_cert), ["testkit-unit-ca"]);

        let server = ca.issue(&Leaf::server().name("etcd.test")).unwrap();
        assert_eq!(pem_der(&server.cert_pem), server.cert_der());
        let cert = parse(server.cert_der());
        assert!(!cert.is_ca());
        assert_eq!(cert.issuer(), ca_cert.subject());
        assert!(cert.validity().is_valid(), "valid now");
        assert!(common_names(&cert).is_empty());
        let san = cert.subject_alternative_name().unwrap().expect("SANs");
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .map(|n| match n {
                GeneralName::IPAddress(ip) => format!("ip {ip:?}"),
                GeneralName::DNSName(d) => format!("dns {d}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            names,
            ["ip [127, 0, 0, 1]", "dns localhost", "dns etcd.test"]
        );
        let eku = cert.extended_key_usage().unwrap().expect("EKU").value;
        assert!(eku.server_auth && !eku.client_auth);
        assert_eq!(key_bits(&cert), 256);
        assert!(server.key_pem.contains("BEGIN PRIVATE KEY"));
    }

    #[test]
    fn a_client_certificate_has_the_common_name_asked_for_or_none_but_always_a_subject() {
        let ca = Ca::new("testkit-unit-ca").unwrap();
        let anonymous = ca.client(None).unwrap();
        let cert = parse(anonymous.cert_der());
        assert!(common_names(&cert).is_empty(), "{}", cert.subject());
        assert_eq!(cert.subject().iter_organization().count(), 1);
        let eku = cert.extended_key_usage().unwrap().expect("EKU").value;
        assert!(eku.client_auth && !eku.server_auth);
        assert!(cert.subject_alternative_name().unwrap().is_none());

        let named = ca.client(Some("root")).unwrap();
        assert_eq!(common_names(&parse(named.cert_der())), ["root"]);
        assert_ne!(anonymous.serial, named.serial, "serials are unique per CA");
    }

    #[test]
    fn validity_windows_and_key_algorithms_are_as_asked() {
        let ca = Ca::with_alg("testkit-unit-p521", KeyAlg::P521).unwrap();
        assert_eq!(key_bits(&parse(ca.cert_der())), 528);
        let expired = ca.issue(&Leaf::server().expired()).unwrap();
        let expired = parse(expired.cert_der());
        let now = since_epoch(now()).as_secs() as i64;
        assert!(!expired.validity().is_valid());
        assert!(expired.validity().not_after.timestamp() < now);
        let early = ca.issue(&Leaf::client(None).not_yet_valid()).unwrap();
        let early = parse(early.cert_der());
        assert!(!early.validity().is_valid());
        assert!(early.validity().not_before.timestamp() > now);
        assert!(early.validity().not_after.timestamp() > now + 300 * 24 * 3600);
        for (alg, bits) in [
            (KeyAlg::P256, 256),
            (KeyAlg::P384, 384),
            (KeyAlg::P521, 528),
        ] {
            let issued = ca.issue(&Leaf::server().alg(alg)).unwrap();
            assert_eq!(key_bits(&parse(issued.cert_der())), bits, "{alg:?}");
        }
        let ed = ca.issue(&Leaf::client(None).alg(KeyAlg::Ed25519)).unwrap();
        assert!(parse(ed.cert_der()).validity().is_valid());
    }

    #[test]
    fn a_crl_lists_the_revoked_serials_and_names_its_ca() {
        let ca = Ca::new("testkit-unit-ca").unwrap();
        let (a, b) = (ca.client(None).unwrap(), ca.client(None).unwrap());
        let pem = ca.crl(&[a.serial]).unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("CRL PEM");
        assert_eq!(block.label, "X509 CRL");
        let (_, crl) = x509_parser::parse_x509_crl(&block.contents).expect("CRL DER");
        assert_eq!(crl.issuer(), parse(ca.cert_der()).subject());
        let listed: Vec<_> = crl
            .iter_revoked_certificates()
            .map(|r| r.serial().clone())
            .collect();
        assert_eq!(listed, [x509_parser::num_bigint::BigUint::from(a.serial)]);
        assert!(!listed.contains(&x509_parser::num_bigint::BigUint::from(b.serial)));
        let empty = ca.crl(&[]).unwrap();
        let (_, block) = x509_parser::pem::parse_x509_pem(empty.as_bytes()).unwrap();
        let (_, crl) = x509_parser::parse_x509_crl(&block.contents).unwrap();
        assert_eq!(crl.iter_revoked_certificates().count(), 0);
    }

    #[test]
    fn files_are_written_and_replaced_whole_with_nothing_left_behind() {
        let dir = crate::dirs::temp_dir("testkit-pki-").unwrap();
        let ca = Ca::new("testkit-unit-ca").unwrap();
        let first = ca.server().unwrap();
        let (cert, key) = first.write(dir.path(), "server").unwrap();
        assert_eq!(std::fs::read_to_string(&cert).unwrap(), first.cert_pem);
        assert_eq!(std::fs::read_to_string(&key).unwrap(), first.key_pem);
        let second = ca.server().unwrap();
        assert_eq!(
            second.write(dir.path(), "server").unwrap(),
            (cert.clone(), key.clone())
        );
        assert_eq!(std::fs::read_to_string(&cert).unwrap(), second.cert_pem);
        assert_eq!(std::fs::read_to_string(&key).unwrap(), second.key_pem);
        let party = ca
            .write_party(dir.path(), "client", &Leaf::client(None))
            .unwrap();
        assert_eq!(std::fs::read_to_string(&party.ca).unwrap(), ca.cert_pem());
        let crl = ca.write_crl(dir.path(), "crl", &[first.serial]).unwrap();
        assert!(
            std::fs::read_to_string(&crl)
                .unwrap()
                .contains("BEGIN X509 CRL")
        );
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "client-ca.pem",
                "client-key.pem",
                "client.pem",
                "crl.pem",
                "server-key.pem",
                "server.pem"
            ]
        );
    }

    /// A server of `server` that requires a client certificate from `client_ca` (checked against `crl`), and a
    /// client trusting `trust` that presents `client` and asks for `name`, handshake over an in-memory pipe; the
    /// server then sends one byte. `Ok` when the client reads it.
    async fn handshake(
        server: &Issued,
        client_ca: &Ca,
        crl: Option<String>,
        trust: &Ca,
        client: &Issued,
        name: &str,
    ) -> Result<(), String> {
        use rustls_pki_types::pem::PemObject as _;
        use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(client_ca.cert_der().to_vec()))
            .unwrap();
        let mut verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.into(),
            provider.clone(),
        );
        if let Some(crl) = crl {
            verifier = verifier
                .with_crls([CertificateRevocationListDer::from_pem_slice(crl.as_bytes()).unwrap()]);
        }
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier.build().unwrap())
            .with_single_cert(
                vec![CertificateDer::from(server.cert_der().to_vec())],
                PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap(),
            )
            .unwrap();
        let dir = crate::dirs::temp_dir("testkit-pki-").unwrap();
        let paths = TlsPaths {
            ca: trust.write(dir.path(), "ca").unwrap(),
            cert: client.write(dir.path(), "client").unwrap().0,
            key: dir.path().join("client-key.pem"),
        };
        let client_config = client_config(&paths)?;
        let (a, b) = tokio::io::duplex(64 * 1024);
        let serve = async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
            if let Ok(mut stream) = acceptor.accept(a).await {
                let _ = stream.write_all(b"!").await;
                let _ = stream.shutdown().await;
            }
        };
        let name = rustls_pki_types::ServerName::try_from(name.to_string()).unwrap();
        let connect = async move {
            let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
            let mut stream = connector
                .connect(name, b)
                .await
                .map_err(|e| e.to_string())?;
            let mut byte = [0u8; 1];
            stream
                .read_exact(&mut byte)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        };
        let ((), result) = tokio::join!(serve, connect);
        result
    }

    #[tokio::test]
    async fn the_certificates_make_a_mutual_tls_handshake_and_the_bad_ones_fail_it() {
        let ca = Ca::new("testkit-unit-ca").unwrap();
        let server = ca.server().unwrap();
        let client = ca.client(None).unwrap();
        handshake(&server, &ca, None, &ca, &client, "127.0.0.1")
            .await
            .unwrap();
        handshake(&server, &ca, None, &ca, &client, "localhost")
            .await
            .unwrap();

        // etcd's --auto-tls curve, on both sides and for the CA.
        let p521 = Ca::with_alg("testkit-unit-p521", KeyAlg::P521).unwrap();
        let p521_server = p521.issue(&Leaf::server().alg(KeyAlg::P521)).unwrap();
        let p521_client = p521.issue(&Leaf::client(None).alg(KeyAlg::P521)).unwrap();
        handshake(&p521_server, &p521, None, &p521, &p521_client, "127.0.0.1")
            .await
            .unwrap();

        let refused = [
            (
                "a name the server lacks",
                handshake(&server, &ca, None, &ca, &client, "example.test").await,
            ),
            (
                "an expired server certificate",
                handshake(
                    &ca.issue(&Leaf::server().expired()).unwrap(),
                    &ca,
                    None,
                    &ca,
                    &client,
                    "127.0.0.1",
                )
                .await,
            ),
            (
                "a server certificate not valid yet",
                handshake(
                    &ca.issue(&Leaf::server().not_yet_valid()).unwrap(),
                    &ca,
                    None,
                    &ca,
                    &client,
                    "127.0.0.1",
                )
                .await,
            ),
            (
                "a server of another CA",
                handshake(&p521_server, &ca, None, &ca, &client, "127.0.0.1").await,
            ),
            (
                "a client of another CA",
                handshake(&server, &ca, None, &ca, &p521_client, "127.0.0.1").await,
            ),
            (
                "an expired client certificate",
                handshake(
                    &server,
                    &ca,
                    None,
                    &ca,
                    &ca.issue(&Leaf::client(None).expired()).unwrap(),
                    "127.0.0.1",
                )
                .await,
            ),
            (
                "a revoked client certificate",
                handshake(
                    &server,
                    &ca,
                    Some(ca.crl(&[client.serial]).unwrap()),
                    &ca,
                    &client,
                    "127.0.0.1",
                )
                .await,
            ),
            (
                "a server certificate used as a client's",
                handshake(&server, &ca, None, &ca, &server, "127.0.0.1").await,
            ),
        ];
        for (what, result) in refused {
            assert!(result.is_err(), "{what} was accepted");
        }
        // A CRL that revokes another certificate leaves this one usable.
        let other = ca.client(None).unwrap();
        handshake(
            &server,
            &ca,
            Some(ca.crl(&[other.serial]).unwrap()),
            &ca,
            &client,
            "127.0.0.1",
        )
        .await
        .unwrap();
    }
}
