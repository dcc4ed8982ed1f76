//! Certificates for the TLS tests, made on the spot with rcgen: certificate authorities, and
//! certificates they sign for servers and clients (valid, expired, or for other names), and
//! revocation lists, all written as PEM files into a directory the test owns.

// Each test binary that includes this module uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, CertifiedIssuer, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber,
};
use time::{Duration, OffsetDateTime};

/// A certificate authority whose certificate is `dir/<name>-ca.pem`.
pub struct Ca {
    name: String,
    dir: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
    next_serial: std::cell::Cell<u64>,
}

/// A certificate and key issued by a [`Ca`], as files.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub serial: u64,
}

impl Pair {
    pub fn cert(&self) -> &str {
        self.cert.to_str().unwrap()
    }

    pub fn key(&self) -> &str {
        self.key.to_str().unwrap()
    }
}

/// What a [`Ca`] is asked to certify: the name of the certificate's files (`<file>.pem` and
/// `<file>-key.pem`), its common name, the names it is valid for and its usage.
#[derive(Clone, Copy, Debug)]
struct CertRequest<'a> {
    file: &'a str,
    cn: &'a str,
    sans: &'a [&'a str],
    usage: Usage,
}

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// Server and client authentication (a member's certificate: peers present it both ways).
    Both,
    Client,
}

impl Ca {
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let issuer = CertifiedIssuer::self_signed(params, key).unwrap();
        std::fs::write(dir.join(format!("{name}-ca.pem")), issuer.pem()).unwrap();
        Ca {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            issuer,
            next_serial: std::cell::Cell::new(100),
        }
    }

    /// The CA's certificate file.
    pub fn cert(&self) -> String {
        self.dir
            .join(format!("{}-ca.pem", self.name))
            .to_str()
            .unwrap()
            .to_string()
    }

    /// A certificate for `cn`, valid for `sans` (IP addresses or DNS names), now until a day
    /// from now.
    pub fn issue(&self, file: &str, cn: &str, sans: &[&str], usage: Usage) -> Pair {
        let now = OffsetDateTime::now_utc();
        let request = CertRequest { file, cn, sans, usage };
        self.issue_between(request, now - Duration::hours(1), now + Duration::days(1))
    }

    /// A certificate that expired an hour ago.
    pub fn issue_expired(&self, file: &str, cn: &str, sans: &[&str], usage: Usage) -> Pair {
        let now = OffsetDateTime::now_utc();
        let request = CertRequest { file, cn, sans, usage };
        self.issue_between(request, now - Duration::days(2), now - Duration::hours(1))
    }

    fn issue_between(&self, request: CertRequest<'_>, not_before: OffsetDateTime, not_after: OffsetDateTime) -> Pair {
        let CertRequest { file, cn, sans, usage } = request;
        let serial = self.next_serial.get();
        self.next_serial.set(serial + 1);
        let mut params = CertificateParams::new(sans.iter().map(|s| (*s).to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.serial_number = Some(SerialNumber::from(serial));
        params.not_before = not_before;
        params.not_after = not_after;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = match usage {
            Usage::Both => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let pair = Pair {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}-key.pem")),
            serial,
        };
        std::fs::write(&pair.cert, cert.pem()).unwrap();
        std::fs::write(&pair.key, key.serialize_pem()).unwrap();
        pair
    }

    /// Writes a CRL revoking `revoked` to `file` (replacing it whole, as a rotation would).
    pub fn write_crl(&self, file: &Path, revoked: &[&Pair]) {
        let now = OffsetDateTime::now_utc();
        let params = CertificateRevocationListParams {
            this_update: now - Duration::hours(1),
            next_update: now + Duration::days(1),
            crl_number: SerialNumber::from(now.unix_timestamp().unsigned_abs()),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|p| RevokedCertParams {
                    serial_number: SerialNumber::from(p.serial),
                    revocation_time: now - Duration::minutes(5),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        let crl = params.signed_by(&self.issuer).unwrap();
        replace(file, crl.pem().unwrap().as_bytes());
    }
}

/// The flags of a member serving clients over mutual TLS with `server` (signed by `ca`), which
/// it also presents on its peer port.
pub fn mtls_flags(ca: &Ca, server: &Pair) -> Vec<String> {
    vec![
        format!("--cert-file={}", server.cert()),
        format!("--key-file={}", server.key()),
        format!("--trusted-ca-file={}", ca.cert()),
        "--client-cert-auth".to_string(),
        format!("--peer-cert-file={}", server.cert()),
        format!("--peer-key-file={}", server.key()),
    ]
}

/// Replaces `file`'s content whole: written beside it, then renamed over it.
pub fn replace(file: &Path, content: &[u8]) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}
