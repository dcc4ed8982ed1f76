//! Checks on a presented certificate beyond its chain, as etcd makes them: the CRL (by serial
//! number, on every certificate of the chain), the allowed common names and the allowed
//! hostnames. And the verifier `--auto-tls` dials out with, which trusts any server.

use std::collections::HashSet;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

/// Revoked serial numbers, without leading zero bytes.
pub type Serials = HashSet<Vec<u8>>;

/// A serial number as Go's `big.Int.Bytes()` gives it: no leading zero bytes.
pub fn serial(raw: &[u8]) -> Vec<u8> {
    let start = raw.iter().position(|b| *b != 0).unwrap_or(raw.len());
    raw.get(start..).unwrap_or_default().to_vec()
}

fn serial_of(cert: &CertificateDer<'_>) -> Option<Vec<u8>> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).ok()?;
    Some(serial(parsed.raw_serial()))
}

/// A client certificate is accepted if its chain verifies, nothing in the chain is revoked,
/// and it has an allowed common name or is valid for an allowed hostname (when those are set).
#[derive(Debug)]
pub struct ClientPolicy {
    pub chain: Arc<dyn ClientCertVerifier>,
    pub revoked: Serials,
    pub allowed_cns: Vec<String>,
    pub allowed_hostnames: Vec<String>,
}

impl ClientPolicy {
    fn allowed(&self, end_entity: &CertificateDer<'_>) -> Result<(), Error> {
        if !self.allowed_cns.is_empty() {
            let cn = common_name(end_entity).unwrap_or_default();
            if !self.allowed_cns.contains(&cn) {
                return Err(Error::General(format!(
                    "client certificate authentication failed: common name {cn:?} is not one of {:?}",
                    self.allowed_cns
                )));
            }
        }
        if !self.allowed_hostnames.is_empty() {
            let cert = webpki::EndEntityCert::try_from(end_entity)
                .map_err(|e| Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(e)))))?;
            let valid = self.allowed_hostnames.iter().any(|host| {
                ServerName::try_from(host.as_str())
                    .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
            });
            if !valid {
                return Err(Error::General(format!(
                    "client certificate authentication failed: not valid for any of {:?}",
                    self.allowed_hostnames
                )));
            }
        }
        Ok(())
    }
}

impl ClientCertVerifier for ClientPolicy {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.chain.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self.chain.verify_client_cert(end_entity, intermediates, now)?;
        if !self.revoked.is_empty() {
            let chain = std::iter::once(end_entity).chain(intermediates);
            if chain.filter_map(serial_of).any(|s| self.revoked.contains(&s)) {
                return Err(Error::InvalidCertificate(CertificateError::Revoked));
            }
        }
        self.allowed(end_entity)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.chain.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.chain.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.supported_verify_schemes()
    }
}

/// Trusts any server certificate, as etcd's members do with `--auto-tls` and
/// `--peer-auto-tls` (their certificates are self-signed); the handshake's signatures are
/// still checked, so the server holds the key of what it presents.
#[derive(Debug)]
pub struct AnyServer(pub Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    // arguments: rustls's ServerCertVerifier chooses them.
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The subject common name of a DER certificate, if it has one.
pub fn common_name(cert: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}
