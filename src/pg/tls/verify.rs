//! The handshake and what decides it: the certificate verifier every `sslmode` uses
//! (the chain when there are roots, the host name for verify-full, the handshake
//! signature always), and the classification of a failed handshake into a
//! [`TlsError`] that says what to fix. Apart from `tls.rs`, which turns the URL's
//! settings and files into a configuration, because this is what runs against a
//! server and judges its certificate.

use std::io;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::{TlsError, TlsSetup};

/// The verifier for every mode: the chain against `roots` when there are roots
/// (allow/prefer/require with a root certificate, verify-ca, verify-full), the host
/// name only for verify-full, and always the handshake signature (the server holds
/// the key of the certificate it presented).
#[derive(Debug)]
pub(super) struct PgCertVerifier {
    pub(super) roots: Option<Arc<RootCertStore>>,
    pub(super) check_host_name: bool,
    pub(super) algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PgCertVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(roots) = &self.roots else {
            return Ok(ServerCertVerified::assertion());
        };
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        if self.check_host_name {
            verify_server_name(&cert, server_name)?;
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

impl TlsSetup {
    /// The TLS handshake with `host` (the name verify-full checks, and the SNI when it
    /// is a DNS name).
    pub async fn handshake(
        &self,
        tcp: TcpStream,
        host: &str,
    ) -> Result<TlsStream<TcpStream>, HandshakeError> {
        let connector = self.connector.as_ref().ok_or_else(|| {
            HandshakeError::Tls(TlsError::Handshake {
                detail: "sslmode=disable has no TLS configuration".into(),
            })
        })?;
        let server_name = ServerName::try_from(host.to_owned()).map_err(|e| {
            HandshakeError::Tls(TlsError::BadHostName {
                host: host.to_owned(),
                reason: e.to_string(),
            })
        })?;
        connector
            .connect(server_name, tcp)
            .await
            .map_err(|error| self.classify(error, host))
    }

    /// A TLS failure as a [`TlsError`] that says what to fix; an I/O error that is not
    /// about TLS stays an I/O error (a reset connection is worth a retry).
    pub fn classify(&self, error: io::Error, host: &str) -> HandshakeError {
        let Some(tls) = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        else {
            return HandshakeError::Io(error);
        };
        HandshakeError::Tls(match tls {
            rustls::Error::InvalidCertificate(cert_error) => match cert_error {
                CertificateError::UnknownIssuer => TlsError::Untrusted {
                    roots: self.roots.clone(),
                    detail: "it is not signed by a CA in".into(),
                },
                CertificateError::BadSignature => TlsError::Untrusted {
                    roots: self.roots.clone(),
                    detail: "its signature does not verify with the CAs in".into(),
                },
                CertificateError::NotValidForNameContext { presented, .. } => {
                    TlsError::NameMismatch {
                        host: host.to_owned(),
                        presented: if presented.is_empty() {
                            "no name (it has no subjectAltName)".into()
                        } else {
                            presented
                                .iter()
                                .map(|name| presented_name(name))
                                .collect::<Vec<_>>()
                                .join(", ")
                        },
                    }
                }
                CertificateError::NotValidForName => TlsError::NameMismatch {
                    host: host.to_owned(),
                    presented: "other names".into(),
                },
                other => TlsError::BadCertificate {
                    detail: other.to_string(),
                },
            },
            rustls::Error::AlertReceived(alert) => TlsError::Refused {
                detail: format!("it sent the alert {alert:?}"),
            },
            other => TlsError::Handshake {
                detail: other.to_string(),
            },
        })
    }
}

/// A subjectAltName as webpki reports it (`DnsName("db.example.com")`,
/// `IpAddress(10.0.0.1)`), as the name alone.
fn presented_name(reported: &str) -> &str {
    reported
        .split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .map(|inner| inner.trim_matches('"'))
        .unwrap_or(reported)
}

/// A failed handshake: about TLS, or the connection itself.
#[derive(Debug)]
pub enum HandshakeError {
    Tls(TlsError),
    Io(io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presented_names_are_shown_bare() {
        assert_eq!(
            presented_name("DnsName(\"db.example.com\")"),
            "db.example.com"
        );
        assert_eq!(presented_name("IpAddress(10.0.0.1)"), "10.0.0.1");
        assert_eq!(presented_name("db.example.com"), "db.example.com");
    }
}
