//! `--auto-tls` and `--peer-auto-tls`: a self-signed certificate for the port's listen hosts,
//! kept in the data directory (`fixtures/client` or `fixtures/peer`, as etcd keeps it) and
//! reused on restart.

use std::path::{Path, PathBuf};

use super::TlsError;

/// The certificate and key in `dir`, made now if either is missing, valid for `hosts` (IP
/// addresses or DNS names) for `years` years.
pub fn ensure(dir: &Path, hosts: &[String], years: u32) -> Result<(PathBuf, PathBuf), TlsError> {
    if years == 0 {
        return Err(TlsError::Config(
            "--self-signed-cert-validity must be greater than 0".into(),
        ));
    }
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    if cert_path.exists() && key_path.exists() {
        return Ok((cert_path, key_path));
    }
    let failed = |e: rcgen::Error| TlsError::Config(format!("cannot make a self-signed certificate: {e}"));
    let mut params = rcgen::CertificateParams::new(hosts.to_vec()).map_err(failed)?;
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::OrganizationName, "etcd");
    params.distinguished_name = name;
    params.not_before = time::OffsetDateTime::now_utc();
    params.not_after = params.not_before + time::Duration::days(365 * i64::from(years));
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(failed)?;
    let cert = params.self_signed(&key).map_err(failed)?;
    let write = |path: &Path, text: &str| {
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(path, text))
            .map_err(|source| TlsError::Read {
                path: path.to_path_buf(),
                source,
            })
    };
    write(&key_path, &key.serialize_pem())?;
    restrict(&key_path)?;
    write(&cert_path, &cert.pem())?;
    tracing::warn!(
        cert = %cert_path.display(),
        not_after = %params.not_after,
        "automatically generated a self-signed certificate"
    );
    Ok((cert_path, key_path))
}

/// Only the owner may read a private key.
fn restrict(path: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}
