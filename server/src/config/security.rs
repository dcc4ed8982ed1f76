//! etcd's TLS flags for the client and peer ports, the versions and suites both use, and the
//! metrics port (`--listen-metrics-urls`).

use std::path::PathBuf;

use clap::{ArgAction, Args};

/// One port's certificate files and rules (etcd's `TLSInfo`); `tls` builds its configurations.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    /// This member's certificate chain and key, as a server (and as a client, unless the
    /// client pair is given).
    pub cert: Option<PathBuf>,
    /// The private key for `cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: Option<PathBuf>,
    /// The pair this member presents when it connects as a client, if not the server pair.
    pub client_cert: Option<PathBuf>,
    /// The private key for `client_cert`; the two are given together or not at all.
    pub client_key: Option<PathBuf>,
    /// The CAs that sign the certificates clients (or, dialing out, servers) present.
    pub trusted_ca: Option<PathBuf>,
    /// Whether clients must present a certificate (also implied by `trusted_ca`, as in etcd).
    pub client_cert_auth: bool,
    /// Revoked certificates: a client presenting one, or one signed by one, is refused.
    pub crl: Option<PathBuf>,
    /// A client certificate must have one of these common names (peers only).
    pub allowed_cns: Vec<String>,
    /// A client certificate must be valid for one of these hostnames or addresses.
    pub allowed_hostnames: Vec<String>,
    /// The certificate is self-signed (`--auto-tls`): dialing out trusts any server.
    pub self_signed: bool,
    /// A client certificate with SANs must name the address it connects from (peers).
    pub check_client_san: bool,
}

impl TlsFiles {
    /// Whether the port has a certificate to serve with.
    pub fn has_cert(&self) -> bool {
        self.cert.is_some() && self.key.is_some()
    }
}

/// The flags of this module.
#[derive(Debug, Args)]
pub struct Security {
    /// The client port's certificate (PEM, the chain after it).
    #[arg(long, value_parser = super::value::path, env = "ETCD_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// The client port's private key (PEM).
    #[arg(long, value_parser = super::value::path, env = "ETCD_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// The certificate this member presents when it dials a client URL (default: --cert-file).
    #[arg(long, value_parser = super::value::path, env = "ETCD_CLIENT_CERT_FILE")]
    pub client_cert_file: Option<PathBuf>,
    /// The key for --client-cert-file.
    #[arg(long, value_parser = super::value::path, env = "ETCD_CLIENT_KEY_FILE")]
    pub client_key_file: Option<PathBuf>,
    /// Clients must present a certificate signed by --trusted-ca-file.
    #[arg(long, env = "ETCD_CLIENT_CERT_AUTH", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub client_cert_auth: bool,
    /// Revoked client certificates (a CRL, PEM or DER).
    #[arg(long, value_parser = super::value::path, env = "ETCD_CLIENT_CRL_FILE")]
    pub client_crl_file: Option<PathBuf>,
    /// Client certificates must be valid for one of these hostnames or addresses (comma-separated).
    #[arg(long, env = "ETCD_CLIENT_CERT_ALLOWED_HOSTNAME", default_value = "")]
    pub client_cert_allowed_hostname: String,
    /// The CAs that sign client certificates (PEM).
    #[arg(long, value_parser = super::value::path, env = "ETCD_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,
    /// Serve clients with a generated self-signed certificate.
    #[arg(long, env = "ETCD_AUTO_TLS", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub auto_tls: bool,

    /// The peer port's certificate (PEM), also presented when dialing peers.
    #[arg(long, value_parser = super::value::path, env = "ETCD_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,
    /// The peer port's private key (PEM).
    #[arg(long, value_parser = super::value::path, env = "ETCD_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,
    /// The certificate presented when dialing peers (default: --peer-cert-file).
    #[arg(long, value_parser = super::value::path, env = "ETCD_PEER_CLIENT_CERT_FILE")]
    pub peer_client_cert_file: Option<PathBuf>,
    /// The key for --peer-client-cert-file.
    #[arg(long, value_parser = super::value::path, env = "ETCD_PEER_CLIENT_KEY_FILE")]
    pub peer_client_key_file: Option<PathBuf>,
    /// Peers must present a certificate signed by --peer-trusted-ca-file.
    #[arg(long, env = "ETCD_PEER_CLIENT_CERT_AUTH", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub peer_client_cert_auth: bool,
    /// The CAs that sign peer certificates (PEM).
    #[arg(long, value_parser = super::value::path, env = "ETCD_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Talk to peers with a generated self-signed certificate.
    #[arg(long, env = "ETCD_PEER_AUTO_TLS", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub peer_auto_tls: bool,
    /// Revoked peer certificates (a CRL, PEM or DER).
    #[arg(long, value_parser = super::value::path, env = "ETCD_PEER_CRL_FILE")]
    pub peer_crl_file: Option<PathBuf>,
    /// Peer certificates must have one of these common names (comma-separated).
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_CN", default_value = "")]
    pub peer_cert_allowed_cn: String,
    /// Peer certificates must be valid for one of these hostnames or addresses (comma-separated).
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_HOSTNAME", default_value = "")]
    pub peer_cert_allowed_hostname: String,
    /// Do not check that a peer certificate's SANs name the address it connects from.
    #[arg(long, env = "ETCD_PEER_SKIP_CLIENT_SAN_VERIFICATION", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub peer_skip_client_san_verification: bool,
    /// etcd 3.5's name for --peer-skip-client-san-verification.
    #[arg(long, env = "ETCD_EXPERIMENTAL_PEER_SKIP_CLIENT_SAN_VERIFICATION", hide = true, action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub experimental_peer_skip_client_san_verification: bool,

    /// Validity of --auto-tls and --peer-auto-tls certificates, in years.
    #[arg(long, env = "ETCD_SELF_SIGNED_CERT_VALIDITY", default_value_t = 1)]
    pub self_signed_cert_validity: u32,
    /// TLS 1.2 cipher suites, by Go's names, comma-separated (empty: rustls's defaults).
    #[arg(long, env = "ETCD_CIPHER_SUITES", default_value = "")]
    pub cipher_suites: String,
    /// The oldest TLS version accepted: TLS1.2 or TLS1.3.
    #[arg(long, env = "ETCD_TLS_MIN_VERSION", default_value = "TLS1.2")]
    pub tls_min_version: String,
    /// The newest TLS version accepted: TLS1.2 or TLS1.3 (empty: the newest).
    #[arg(long, env = "ETCD_TLS_MAX_VERSION", default_value = "")]
    pub tls_max_version: String,
    /// How clients authenticate: `simple`, or `jwt,pub-key=…,priv-key=…,sign-method=…,ttl=…`.
    #[arg(long, env = "ETCD_AUTH_TOKEN", default_value = "simple")]
    pub auth_token: String,
    /// How long a simple token lives unused, in seconds.
    #[arg(long, env = "ETCD_AUTH_TOKEN_TTL", default_value_t = 300)]
    pub auth_token_ttl: u64,
    /// bcrypt's cost for hashing passwords (4 to 31).
    #[arg(long, env = "ETCD_BCRYPT_COST", default_value_t = 10)]
    pub bcrypt_cost: u32,
    /// URLs that serve /metrics and the health endpoints alone, comma-separated.
    #[arg(long, env = "ETCD_LISTEN_METRICS_URLS", default_value = "")]
    pub listen_metrics_urls: String,
}

/// A file flag: an empty value, as etcd's help shows its default, is no file.
fn file(path: &Option<PathBuf>) -> Option<PathBuf> {
    path.clone().filter(|p| !p.as_os_str().is_empty())
}

fn list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl Security {
    /// The client port's files and rules, as flags give them (before `--auto-tls`).
    pub fn client_files(&self) -> TlsFiles {
        TlsFiles {
            cert: file(&self.cert_file),
            key: file(&self.key_file),
            client_cert: file(&self.client_cert_file),
            client_key: file(&self.client_key_file),
            trusted_ca: file(&self.trusted_ca_file),
            client_cert_auth: self.client_cert_auth,
            crl: file(&self.client_crl_file),
            allowed_cns: Vec::new(),
            allowed_hostnames: list(&self.client_cert_allowed_hostname),
            self_signed: false,
            check_client_san: false,
        }
    }

    /// The peer port's files and rules, as flags give them (before `--peer-auto-tls`).
    pub fn peer_files(&self) -> TlsFiles {
        TlsFiles {
            cert: file(&self.peer_cert_file),
            key: file(&self.peer_key_file),
            client_cert: file(&self.peer_client_cert_file),
            client_key: file(&self.peer_client_key_file),
            trusted_ca: file(&self.peer_trusted_ca_file),
            client_cert_auth: self.peer_client_cert_auth,
            crl: file(&self.peer_crl_file),
            allowed_cns: list(&self.peer_cert_allowed_cn),
            allowed_hostnames: list(&self.peer_cert_allowed_hostname),
            self_signed: false,
            check_client_san: !(self.peer_skip_client_san_verification
                || self.experimental_peer_skip_client_san_verification),
        }
    }
}
