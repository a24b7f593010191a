//! `--auto-tls`: a self-signed certificate for the listener, kept under `<data-dir>/fixtures/proxy` as the Go proxy
//! keeps it, and reused when a pair is already there.
//!
//! The proxy makes an ECDSA P-256 key (every TLS client has P-256, and its handshakes cost a fraction of P-521's).
//! A P-521 pair that a Go proxy left in the same directory is reused as it is: the aws-lc-rs provider signs with
//! P-521 keys.

use std::path::{Path, PathBuf};

use super::TlsError;

/// The certificate and key under `dir`, made now if either is missing, valid for `validity_years` for `host` (an
/// IP address or a DNS name).
pub fn ensure(dir: &Path, validity_years: u32, host: &str) -> Result<(PathBuf, PathBuf), TlsError> {
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    if cert.exists() && key.exists() {
        tracing::info!(dir = %dir.display(), "--auto-tls: reusing the certificate found there");
        return Ok((cert, key));
    }
    let (cert_pem, key_pem) = make(validity_years, host)?;
    create_private_dir(dir)?;
    write(&key, key_pem.as_bytes(), 0o600)?;
    write(&cert, cert_pem.as_bytes(), 0o644)?;
    tracing::info!(dir = %dir.display(), validity_years, host, "--auto-tls: made a self-signed certificate");
    Ok((cert, key))
}

fn make(validity_years: u32, host: &str) -> Result<(String, String), TlsError> {
    let fail = |e: rcgen::Error| TlsError(format!("--auto-tls: cannot make a certificate: {e}"));
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(fail)?;
    let mut params = rcgen::CertificateParams::new(vec![host.to_string()]).map_err(fail)?;
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "etcd");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now;
    params.not_after = now + time::Duration::days(365 * i64::from(validity_years));
    let cert = params.self_signed(&key).map_err(fail)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn create_private_dir(dir: &Path) -> Result<(), TlsError> {
    let fail =
        |e: std::io::Error| TlsError(format!("--auto-tls: cannot create {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    set_mode(dir, 0o700).map_err(fail)
}

fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<(), TlsError> {
    let fail =
        |e: std::io::Error| TlsError(format!("--auto-tls: cannot write {}: {e}", path.display()));
    std::fs::write(path, bytes).map_err(fail)?;
    set_mode(path, mode).map_err(fail)
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_made_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let fixtures = dir.path().join("fixtures/proxy");
        let (cert, key) = ensure(&fixtures, 1, "127.0.0.1").unwrap();
        let first = std::fs::read(&cert).unwrap();
        let chain = super::super::pem::certificates(&cert).unwrap();
        super::super::pem::check_validity(&cert, &chain[0]).unwrap();
        super::super::pem::private_key(&key).unwrap();
        let (again, _) = ensure(&fixtures, 1, "127.0.0.1").unwrap();
        assert_eq!(std::fs::read(again).unwrap(), first);
    }
}
