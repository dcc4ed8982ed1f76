//! A port's TLS: the rustls configurations built from its files, rebuilt when one of them
//! changes on disk, and etcd's protocol and cipher-suite flags.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedProtocolVersion};

use super::verify;
use crate::config::TlsFiles as Files;

/// Why TLS cannot be set up, or a handshake cannot start.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate, key, CA or CRL file could not be read (or, for `--auto-tls`, written).
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why reading or writing it failed.
        source: std::io::Error,
    },
    /// A file was read but holds no usable certificate, key or CRL.
    #[error("{path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with its contents.
        reason: String,
    },
    /// The flags do not make a working setup: a bad TLS version or cipher suite, a missing
    /// file, a pair given by halves, an https URL without a certificate, a self-signed
    /// certificate that cannot be made.
    #[error("{0}")]
    Config(String),
    /// rustls refused the configuration (for example, a key that does not match its
    /// certificate, or versions the suites cannot serve).
    #[error(transparent)]
    Rustls(#[from] rustls::Error),
}

/// What etcd's `--cipher-suites`, `--tls-min-version` and `--tls-max-version` decide, for
/// every port.
#[derive(Clone, Debug)]
pub struct Protocols {
    provider: Arc<CryptoProvider>,
    versions: Vec<&'static SupportedProtocolVersion>,
}

/// Go's names of the TLS 1.2 suites rustls offers, with the suite each means.
const TLS12_SUITES: [(&str, rustls::CipherSuite); 8] = {
    use rustls::CipherSuite as S;
    [
        (
            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            S::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
            S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
            S::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            S::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
        (
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
            S::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        ),
    ]
};

/// Go's names of TLS 1.3 suites (Go ignores them in a suite list; so does cairn: TLS 1.3
/// always offers all three).
const TLS13_NAMES: [&str; 3] = [
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// Suites Go knows and rustls does not offer (CBC, RC4, 3DES and static-RSA key exchange):
/// named in `--cipher-suites`, they are skipped with a warning.
const UNOFFERED: [&str; 16] = [
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
];

fn tls_version(flag: &str, value: &str) -> Result<Option<&'static SupportedProtocolVersion>, TlsError> {
    match value {
        "" => Ok(None),
        "TLS1.2" => Ok(Some(&rustls::version::TLS12)),
        "TLS1.3" => Ok(Some(&rustls::version::TLS13)),
        other => Err(TlsError::Config(format!(
            "--{flag}: unexpected TLS version {other:?} (must be one of: TLS1.2, TLS1.3)"
        ))),
    }
}

impl Protocols {
    /// Reads the three flags as etcd does: versions `TLS1.2` or `TLS1.3` (an empty maximum is
    /// the newest), suites by Go's names, an unknown name refused.
    pub fn new(cipher_suites: &str, min: &str, max: &str) -> Result<Protocols, TlsError> {
        let min_version = tls_version("tls-min-version", min)?.unwrap_or(&rustls::version::TLS12);
        let max_version = tls_version("tls-max-version", max)?.unwrap_or(&rustls::version::TLS13);
        let rank = |v: &SupportedProtocolVersion| u16::from(v.version);
        if rank(min_version) > rank(max_version) {
            return Err(TlsError::Config(format!(
                "min version ({min}) is greater than max version ({max})"
            )));
        }
        let versions: Vec<_> = [&rustls::version::TLS12, &rustls::version::TLS13]
            .into_iter()
            .filter(|v| rank(v) >= rank(min_version) && rank(v) <= rank(max_version))
            .collect();
        let names: Vec<&str> = cipher_suites
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let mut provider = rustls::crypto::ring::default_provider();
        if !names.is_empty() {
            if !versions.contains(&&rustls::version::TLS12) {
                return Err(TlsError::Config(
                    "cipher suites cannot be configured when only TLS1.3 is enabled".into(),
                ));
            }
            let mut chosen = Vec::new();
            for name in names {
                if let Some((_, id)) = TLS12_SUITES.iter().find(|(n, _)| *n == name) {
                    let suite = provider.cipher_suites.iter().find(|s| s.suite() == *id);
                    if let Some(suite) = suite.filter(|s| !chosen.contains(*s)) {
                        chosen.push(*suite);
                    }
                } else if UNOFFERED.contains(&name) {
                    tracing::warn!(
                        suite = name,
                        "--cipher-suites: rustls does not offer this suite; skipped"
                    );
                } else if !TLS13_NAMES.contains(&name) {
                    return Err(TlsError::Config(format!(
                        "--cipher-suites: unexpected TLS cipher suite {name:?}"
                    )));
                }
            }
            if chosen.is_empty() {
                return Err(TlsError::Config(
                    "--cipher-suites names no TLS 1.2 suite cairn offers (ECDHE with AES-GCM or ChaCha20-Poly1305)"
                        .into(),
                ));
            }
            let tls13 = provider.cipher_suites.iter().filter(|s| s.tls13().is_some()).copied();
            chosen.extend(tls13);
            provider.cipher_suites = chosen;
        }
        Ok(Protocols {
            provider: Arc::new(provider),
            versions,
        })
    }
}

/// The paths `files` names.
fn paths(files: &Files) -> impl Iterator<Item = &PathBuf> {
    [
        &files.cert,
        &files.key,
        &files.client_cert,
        &files.client_key,
        &files.trusted_ca,
        &files.crl,
    ]
    .into_iter()
    .flatten()
}

/// What the files looked like when a configuration was built from them: size, modification
/// time and inode of each (none for a file that could not be read).
type Stamp = Vec<Option<(u64, std::time::SystemTime, u64)>>;

fn stamp(files: &Files) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    paths(files)
        .map(|p| {
            std::fs::metadata(p)
                .ok()
                .map(|m| (m.len(), m.modified().unwrap_or(std::time::UNIX_EPOCH), m.ino()))
        })
        .collect()
}

/// A configuration and the stamp of the files it was built from.
#[derive(Debug)]
struct Built<C> {
    stamp: Stamp,
    config: Arc<C>,
}

#[derive(Debug)]
struct Inner {
    files: Files,
    protocols: Protocols,
    server: Mutex<Option<Built<ServerConfig>>>,
    client: Mutex<Option<Built<ClientConfig>>>,
}

/// One port's TLS: its files and rules, and the configurations built from them.
#[derive(Clone, Debug)]
pub struct Tls(Arc<Inner>);

impl Tls {
    /// Checks that the files make a working server configuration now: a missing or unreadable
    /// file is a startup error, as in etcd, not a failure at the first handshake.
    pub fn new(files: Files, protocols: Protocols) -> Result<Tls, TlsError> {
        if files.client_cert.is_some() != files.client_key.is_some() {
            return Err(TlsError::Config(
                "the client certificate and key files must be given together".into(),
            ));
        }
        let tls = Tls(Arc::new(Inner {
            files,
            protocols,
            server: Mutex::new(None),
            client: Mutex::new(None),
        }));
        if tls.0.files.has_cert() {
            tls.server_config()?;
        }
        tls.client_config()?;
        Ok(tls)
    }

    /// The files and rules this port's TLS was made from.
    pub fn files(&self) -> &Files {
        &self.0.files
    }

    /// The server configuration, rebuilt if a file changed since the last handshake.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        current(&self.0.server, &self.0.files, || self.build_server())
    }

    /// The configuration for dialing out, rebuilt if a file changed since the last dial.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        current(&self.0.client, &self.0.files, || self.build_client())
    }

    fn build_server(&self) -> Result<ServerConfig, TlsError> {
        let files = &self.0.files;
        let (Some(cert), Some(key)) = (&files.cert, &files.key) else {
            return Err(TlsError::Config("TLS needs both a certificate and a key file".into()));
        };
        let chain = certificates(cert)?;
        let key = private_key(key)?;
        let provider = self.0.protocols.provider.clone();
        let builder =
            ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(&self.0.protocols.versions)?;
        let require_client_cert = files.client_cert_auth || files.trusted_ca.is_some();
        let mut config = if require_client_cert {
            let Some(ca) = &files.trusted_ca else {
                return Err(TlsError::Config(
                    "client certificate authentication needs a trusted CA file".into(),
                ));
            };
            let roots = Arc::new(root_store(ca)?);
            let chain_check = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| TlsError::Config(format!("{}: {e}", ca.display())))?;
            let revoked = match &files.crl {
                Some(crl) => revoked_serials(crl)?,
                None => Default::default(),
            };
            let policy = verify::ClientPolicy {
                chain: chain_check,
                revoked,
                allowed_cns: files.allowed_cns.clone(),
                allowed_hostnames: files.allowed_hostnames.clone(),
            };
            builder
                .with_client_cert_verifier(Arc::new(policy))
                .with_single_cert(chain, key)?
        } else {
            builder.with_no_client_auth().with_single_cert(chain, key)?
        };
        // gRPC clients (Go's since 1.67) insist on ALPN h2; HTTP clients may ask for 1.1.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    fn build_client(&self) -> Result<ClientConfig, TlsError> {
        let files = &self.0.files;
        let provider = self.0.protocols.provider.clone();
        let builder =
            ClientConfig::builder_with_provider(provider.clone()).with_protocol_versions(&self.0.protocols.versions)?;
        let builder = if files.self_signed {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verify::AnyServer(provider)))
        } else {
            let roots = match &files.trusted_ca {
                Some(ca) => root_store(ca)?,
                None => RootCertStore::empty(),
            };
            builder.with_root_certificates(roots)
        };
        let pair = match (&files.client_cert, &files.client_key, &files.cert, &files.key) {
            (Some(c), Some(k), _, _) | (None, None, Some(c), Some(k)) => Some((c, k)),
            _ => None,
        };
        let mut config = match pair {
            Some((cert, key)) => builder.with_client_auth_cert(certificates(cert)?, private_key(key)?)?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

/// The cached configuration if the files have not changed since it was built, else a new one.
/// A file that fails to load keeps the error for this handshake; the next one tries again.
fn current<C>(
    slot: &Mutex<Option<Built<C>>>,
    files: &Files,
    build: impl FnOnce() -> Result<C, TlsError>,
) -> Result<Arc<C>, TlsError> {
    let now = stamp(files);
    if let Some(built) = slot.lock().as_ref().filter(|b| b.stamp == now) {
        return Ok(built.config.clone());
    }
    let config = Arc::new(build()?);
    if slot.lock().is_some() {
        tracing::info!("certificate files changed on disk; new handshakes use them");
    }
    *slot.lock() = Some(Built {
        stamp: now,
        config: config.clone(),
    });
    Ok(config)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_error(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::Parse {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Every certificate in a PEM file, in order.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| parse_error(path, e))?;
    if certs.is_empty() {
        return Err(parse_error(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(&read(path)?).map_err(|e| parse_error(path, format!("no usable private key: {e}")))
}

fn root_store(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).map_err(|e| parse_error(path, e))?;
    }
    Ok(roots)
}

/// The serial numbers a CRL file (PEM or DER, one or more lists) revokes, without leading zero
/// bytes. As in etcd, the lists' signatures are not checked: the file is trusted as configured.
fn revoked_serials(path: &Path) -> Result<verify::Serials, TlsError> {
    let bytes = read(path)?;
    let lists: Vec<Vec<u8>> = if bytes.starts_with(b"-----") {
        CertificateRevocationListDer::pem_slice_iter(&bytes)
            .map(|crl| crl.map(|c| c.as_ref().to_vec()))
            .collect::<Result<_, _>>()
            .map_err(|e| parse_error(path, e))?
    } else {
        vec![bytes]
    };
    let mut serials = verify::Serials::default();
    for der in &lists {
        let (_, crl) = x509_parser::parse_x509_crl(der).map_err(|e| parse_error(path, e))?;
        serials.extend(crl.iter_revoked_certificates().map(|r| verify::serial(r.raw_serial())));
    }
    Ok(serials)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suites_and_versions_read_as_etcd_reads_them() {
        assert_eq!(Protocols::new("", "TLS1.2", "").unwrap().versions.len(), 2);
        assert_eq!(Protocols::new("", "TLS1.3", "").unwrap().versions.len(), 1);
        assert_eq!(Protocols::new("", "", "TLS1.2").unwrap().versions.len(), 1);
        let e = Protocols::new("", "TLS1.3", "TLS1.2").unwrap_err().to_string();
        assert_eq!(e, "min version (TLS1.3) is greater than max version (TLS1.2)");
        assert!(Protocols::new("", "TLS1.1", "").is_err());
        let p = Protocols::new(
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
            "TLS1.2",
            "",
        )
        .unwrap();
        // The one TLS 1.2 suite named, first, and the three TLS 1.3 suites.
        assert_eq!(p.provider.cipher_suites.len(), 4);
        assert_eq!(
            p.provider.cipher_suites.first().map(|s| s.suite()),
            Some(rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256)
        );
        assert!(Protocols::new("TLS_NO_SUCH_SUITE", "", "").is_err());
        assert!(Protocols::new("TLS_RSA_WITH_AES_128_CBC_SHA", "", "").is_err());
        let e = Protocols::new("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS1.3", "").unwrap_err();
        assert_eq!(
            e.to_string(),
            "cipher suites cannot be configured when only TLS1.3 is enabled"
        );
    }
}
