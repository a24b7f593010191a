//! Reading certificates, private keys and CRLs from PEM files, with errors that name the file and the reason, and
//! the checks the proxy makes of its own certificates before it uses them.

use std::path::Path;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use x509_parser::prelude::{ASN1Time, FromDer, X509Certificate};

use super::TlsError;

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError(format!("cannot read {}: {e}", path.display())))
}

/// Every certificate in a PEM file, in order (a leaf followed by its intermediates, or a CA bundle).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            TlsError(format!(
                "{}: not a PEM certificate file: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(TlsError(format!(
            "{}: no certificate found (expected PEM \"BEGIN CERTIFICATE\" blocks)",
            path.display()
        )));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, SEC1 or PKCS#1).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| TlsError(format!("{}: no private key found: {e}", path.display())))
}

/// Every CRL in a PEM file.
pub fn crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let pem = read(path)?;
    let crls = CertificateRevocationListDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError(format!("{}: not a PEM CRL file: {e}", path.display())))?;
    if crls.is_empty() {
        return Err(TlsError(format!(
            "{}: no CRL found (expected PEM \"BEGIN X509 CRL\" blocks)",
            path.display()
        )));
    }
    Ok(crls)
}

/// A CA bundle as trust anchors. Each certificate must be usable as one, and must be valid now.
pub fn trust_anchors(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        check_validity(path, &cert)?;
        roots.add(cert).map_err(|e| {
            TlsError(format!(
                "{}: not a usable CA certificate: {e}",
                path.display()
            ))
        })?;
    }
    Ok(roots)
}

/// Refuses a certificate that has expired or is not valid yet: it would fail every handshake, and the operator
/// learns why now rather than from each peer.
pub fn check_validity(path: &Path, cert: &CertificateDer<'_>) -> Result<(), TlsError> {
    let parsed = parse(path, cert)?;
    let validity = parsed.validity();
    let now = ASN1Time::now();
    if now < validity.not_before {
        return Err(TlsError(format!(
            "{}: certificate is not valid before {}",
            path.display(),
            validity.not_before
        )));
    }
    if now > validity.not_after {
        return Err(TlsError(format!(
            "{}: certificate expired at {}",
            path.display(),
            validity.not_after
        )));
    }
    Ok(())
}

/// The subject Common Name of a certificate, if it has a non-empty one.
pub fn common_name(path: &Path, cert: &CertificateDer<'_>) -> Result<Option<String>, TlsError> {
    let parsed = parse(path, cert)?;
    let name = parsed
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok())
        .find(|cn| !cn.is_empty())
        .map(str::to_string);
    Ok(name)
}

fn parse<'a>(path: &Path, cert: &'a CertificateDer<'_>) -> Result<X509Certificate<'a>, TlsError> {
    X509Certificate::from_der(cert.as_ref())
        .map(|(_, parsed)| parsed)
        .map_err(|e| {
            TlsError(format!(
                "{}: not a valid X.509 certificate: {e}",
                path.display()
            ))
        })
}

/// Why a certificate and its key could not be used together, in words.
pub fn identity_error(cert: &Path, key: &Path, err: rustls::Error) -> TlsError {
    let reason = match err {
        rustls::Error::InconsistentKeys(_) => {
            "the private key does not match the certificate".to_string()
        }
        other => other.to_string(),
    };
    TlsError(format!(
        "{} with {}: {reason}",
        cert.display(),
        key.display()
    ))
}
