//! TLS to PostgreSQL, with libpq's `sslmode` meanings, on rustls (`ring` provider).
//!
//! ```text
//!  client                                   server
//!  SSLRequest (Int32 8, Int32 80877103) ──▶
//!                                       ◀── 'S' (one byte, nothing after it)  → TLS handshake,
//!                                                                             then StartupMessage
//!                                       ◀── 'N'                               → plain (prefer, allow)
//!                                                                             or refuse (require, verify-*)
//! ```
//!
//! What each mode does (as libpq; a root certificate is `sslrootcert`, else
//! `~/.postgresql/root.crt` when that file exists):
//!
//! | sslmode     | TLS                            | certificate chain          | host name |
//! |-------------|--------------------------------|----------------------------|-----------|
//! | disable     | never                          | -                          | -         |
//! | allow       | plain first, TLS if refused    | if a root certificate      | no        |
//! | prefer      | TLS first, plain if refused    | if a root certificate      | no        |
//! | require     | always                         | if a root certificate      | no        |
//! | verify-ca   | always                         | always (root cert needed)  | no        |
//! | verify-full | always                         | always (root cert needed)  | yes       |
//!
//! Security notes. Bytes the server sends after its 'S' and before the handshake are
//! refused (CVE-2021-23222: a man in the middle could inject them as if they came
//! over TLS). Two deliberate differences from libpq, both failing where libpq would
//! silently not protect: an `sslrootcert` or `sslcert` that is set but missing is an
//! error in every mode (libpq ignores a missing file below verify-ca); and the host
//! name is matched against the certificate's subjectAltNames only (no fallback to the
//! Common Name, which RFC 6125 deprecates; every managed PostgreSQL's certificates
//! carry SANs). SCRAM channel binding is not implemented: the client sends the gs2
//! flag 'n' (does not support binding), which PostgreSQL accepts over TLS.

mod files;
mod stream;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use files::{
    certificates_from_file, home_postgresql_dir, key_from_file, roots_from_file, system_roots,
};
pub use stream::PgStream;

/// `sslmode`: whether and how to use TLS (libpq's values and meanings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    Allow,
    /// libpq's default.
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a plaintext session is unacceptable.
    pub fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }

    /// Whether the certificate chain must be verified (a root certificate is needed).
    fn requires_verification(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `sslrootcert`: the CA certificates that sign the server's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file with one or more certificates.
    File(PathBuf),
    /// `sslrootcert=system`: the operating system's trust store.
    System,
}

/// The TLS parameters of a connection URL (`sslmode`, `sslrootcert`, `sslcert`,
/// `sslkey`). Files are read when connecting, so rotated certificates are picked up
/// by the next connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsParams {
    pub mode: SslMode,
    /// Explicit `sslrootcert`; unset = `~/.postgresql/root.crt` if it exists.
    pub root_cert: Option<RootCert>,
    /// Explicit `sslcert`; unset = `~/.postgresql/postgresql.crt` if it exists.
    pub cert: Option<PathBuf>,
    /// Explicit `sslkey`; unset = `~/.postgresql/postgresql.key`.
    pub key: Option<PathBuf>,
}

/// libpq's default file names under `~/.postgresql/`.
const DEFAULT_ROOT_CERT: &str = "root.crt";
const DEFAULT_CLIENT_CERT: &str = "postgresql.crt";
const DEFAULT_CLIENT_KEY: &str = "postgresql.key";
/// The ALPN protocol name PostgreSQL 17 registered; servers before 17 ignore ALPN.
const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// Why TLS could not be set up or established. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {param} file {}: {source}; set {param} in [postgres] url to a readable PEM file", path.display())]
    ReadFile {
        param: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{param} file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----){}", path.display(), reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    NoCertificate {
        param: &'static str,
        path: PathBuf,
        reason: Option<String>,
    },
    #[error("sslkey file {} holds no private key: expected a PEM private key (PKCS#8 \"PRIVATE KEY\", PKCS#1 \"RSA PRIVATE KEY\" or SEC1 \"EC PRIVATE KEY\")", path.display())]
    NoKey { path: PathBuf },
    #[error("sslkey file {} is encrypted, and sslpassword is not supported: store it decrypted (openssl pkey -in KEY -out KEY.plain) with permissions 0600", path.display())]
    EncryptedKey { path: PathBuf },
    #[error("private key file {} has group or world access (mode {mode:04o}); file must have permissions u=rw (0600) or less if owned by the current user, or permissions u=rw,g=r (0640) or less if owned by root", path.display())]
    KeyPermissions { path: PathBuf, mode: u32 },
    #[error("certificate present, but not private key file {}: set sslkey in [postgres] url to the key of sslcert {}", key.display(), cert.display())]
    CertWithoutKey { cert: PathBuf, key: PathBuf },
    #[error("the client certificate {} and key {} do not fit together ({reason}): set sslcert and sslkey to a certificate and its own key", cert.display(), key.display())]
    ClientIdentity {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
    #[error("sslmode={mode} verifies the server certificate, but there is no root certificate: set sslrootcert=/path/to/ca.pem in [postgres] url (the CA that signed the server's certificate; for a managed PostgreSQL, the provider's CA bundle), or sslrootcert=system for the operating system's trust store ({default} does not exist either)")]
    NoRootCert { mode: SslMode, default: String },
    #[error("sslrootcert=system: no certificate found in the operating system's trust store ({reason}); install the ca-certificates package or set sslrootcert to a PEM file")]
    SystemRoots { reason: String },
    #[error("weak sslmode {mode:?} may not be used with sslrootcert=system (use \"verify-full\"): with the public CAs of the system store, only the host name check makes the certificate mean anything")]
    WeakModeWithSystemRoots { mode: &'static str },
    #[error("host name {host:?} cannot be checked against a certificate: {reason}")]
    BadHostName { host: String, reason: String },
    #[error("the server does not accept TLS (it answered 'N' to SSLRequest), but sslmode={mode} requires it: turn on ssl in postgresql.conf (ssl=on, ssl_cert_file, ssl_key_file), or, on a trusted network only, use sslmode=prefer or disable")]
    ServerRefusedTls { mode: SslMode },
    #[error("received unencrypted data after the SSL response: the server (or something between it and us) sent bytes before the TLS handshake, which could be injected by a man in the middle (CVE-2021-23222); refusing the connection")]
    UnencryptedDataAfterResponse,
    #[error("invalid response to SSLRequest: {detail}")]
    BadSslResponse { detail: String },
    #[error("the server's certificate is not trusted: {detail} {roots}; set sslrootcert in [postgres] url to the CA that signed it (for a managed PostgreSQL, the provider's CA bundle). Encrypting without verifying (sslmode=require and no sslrootcert) is not safe against a man in the middle")]
    Untrusted { roots: String, detail: String },
    #[error("the server's certificate is for {presented}, not for {host:?} (the host in [postgres] url): connect with a name the certificate lists, or reissue the certificate with this name in its subjectAltName; sslmode=verify-ca checks the CA but not the name")]
    NameMismatch { host: String, presented: String },
    #[error("the server's certificate is not valid: {detail}")]
    BadCertificate { detail: String },
    #[error("the server refused the TLS session: {detail}{}", client_cert_hint(.detail))]
    Refused { detail: String },
    #[error("TLS handshake failed: {detail}")]
    Handshake { detail: String },
}

fn client_cert_hint(detail: &str) -> &'static str {
    let lower = detail.to_ascii_lowercase();
    if lower.contains("certificate") || lower.contains("unknown ca") || lower.contains("unknownca")
    {
        "; if the server checks client certificates (pg_hba.conf `cert` or clientcert=verify-ca/verify-full), set sslcert and sslkey in [postgres] url to a certificate signed by the server's ssl_ca_file"
    } else {
        ""
    }
}

/// What [`TlsParams::load`] prepared for all connection attempts of one connect.
#[derive(Clone)]
pub struct TlsSetup {
    pub mode: SslMode,
    /// `None` for sslmode=disable.
    connector: Option<TlsConnector>,
    /// Where trusted CAs came from, for error messages.
    roots: String,
}

impl fmt::Debug for TlsSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSetup")
            .field("mode", &self.mode)
            .field("roots", &self.roots)
            .finish_non_exhaustive()
    }
}

impl TlsParams {
    /// Checks the combinations that are wrong whatever the files hold.
    pub fn validate(&self) -> Result<(), TlsError> {
        if self.root_cert == Some(RootCert::System) && self.mode != SslMode::VerifyFull {
            return Err(TlsError::WeakModeWithSystemRoots {
                mode: self.mode.as_str(),
            });
        }
        Ok(())
    }

    /// Reads the certificate files and builds the rustls configuration.
    pub fn load(&self) -> Result<TlsSetup, TlsError> {
        self.validate()?;
        if self.mode == SslMode::Disable {
            return Ok(TlsSetup {
                mode: self.mode,
                connector: None,
                roots: String::new(),
            });
        }
        let home = home_postgresql_dir();
        let (roots, roots_text) = match &self.root_cert {
            Some(RootCert::System) => (Some(system_roots()?), "the system trust store".into()),
            Some(RootCert::File(path)) => (
                Some(roots_from_file(path)?),
                format!("sslrootcert {}", path.display()),
            ),
            None => {
                let default = home.as_ref().map(|dir| dir.join(DEFAULT_ROOT_CERT));
                match default.as_ref().filter(|path| path.exists()) {
                    Some(path) => (Some(roots_from_file(path)?), format!("{}", path.display())),
                    None if self.mode.requires_verification() => {
                        return Err(TlsError::NoRootCert {
                            mode: self.mode,
                            default: default
                                .map(|p| p.display().to_string())
                                .unwrap_or_else(|| format!("~/.postgresql/{DEFAULT_ROOT_CERT}")),
                        })
                    }
                    None => (None, String::new()),
                }
            }
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Arc::new(PgCertVerifier {
            roots: roots.map(Arc::new),
            check_host_name: self.mode == SslMode::VerifyFull,
            algorithms: provider.signature_verification_algorithms,
        });
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Handshake {
                detail: e.to_string(),
            })?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let mut config = match self.client_identity(home.as_deref())? {
            Some((cert_path, certs, key_path, key)) => builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| TlsError::ClientIdentity {
                    cert: cert_path,
                    key: key_path,
                    reason: e.to_string(),
                })?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
        Ok(TlsSetup {
            mode: self.mode,
            connector: Some(TlsConnector::from(Arc::new(config))),
            roots: roots_text,
        })
    }

    /// The client certificate chain and key, if any: `sslcert`/`sslkey`, else libpq's
    /// default files when the certificate file exists.
    #[allow(clippy::type_complexity)]
    fn client_identity(
        &self,
        home: Option<&Path>,
    ) -> Result<
        Option<(
            PathBuf,
            Vec<CertificateDer<'static>>,
            PathBuf,
            PrivateKeyDer<'static>,
        )>,
        TlsError,
    > {
        let cert_path = match (&self.cert, home) {
            (Some(path), _) => path.clone(),
            (None, Some(home)) if home.join(DEFAULT_CLIENT_CERT).exists() => {
                home.join(DEFAULT_CLIENT_CERT)
            }
            (None, _) => return Ok(None),
        };
        let certs = certificates_from_file("sslcert", &cert_path)?;
        let key_path = match (&self.key, home) {
            (Some(path), _) => path.clone(),
            (None, Some(home)) => home.join(DEFAULT_CLIENT_KEY),
            (None, None) => PathBuf::from(format!("~/.postgresql/{DEFAULT_CLIENT_KEY}")),
        };
        if !key_path.exists() {
            return Err(TlsError::CertWithoutKey {
                cert: cert_path,
                key: key_path,
            });
        }
        let key = key_from_file(&key_path)?;
        Ok(Some((cert_path, certs, key_path, key)))
    }
}

/// The verifier for every mode: the chain against `roots` when there are roots
/// (allow/prefer/require with a root certificate, verify-ca, verify-full), the host
/// name only for verify-full, and always the handshake signature (the server holds
/// the key of the certificate it presented).
#[derive(Debug)]
struct PgCertVerifier {
    roots: Option<Arc<RootCertStore>>,
    check_host_name: bool,
    algorithms: WebPkiSupportedAlgorithms,
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

/// The server's answer to SSLRequest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslResponse {
    /// 'S': go on with the TLS handshake.
    Accepted,
    /// 'N': the server does not do TLS; the session goes on in plaintext.
    Refused,
    /// 'E': an ErrorResponse (e.g. the server could not start a session); the bytes
    /// are its start, to be read as the session's error as libpq does.
    Error,
}

/// Decides on everything the server sent in reply to SSLRequest (pure). Anything after
/// the one response byte is refused: after 'S' it would be taken as if it came over
/// TLS (CVE-2021-23222); after 'N' the server must wait for our startup message.
pub fn parse_ssl_response(received: &[u8]) -> Result<SslResponse, TlsError> {
    match received {
        [b'S'] => Ok(SslResponse::Accepted),
        [b'S', ..] => Err(TlsError::UnencryptedDataAfterResponse),
        [b'N'] => Ok(SslResponse::Refused),
        [b'N', ..] => Err(TlsError::BadSslResponse {
            detail: format!(
                "{} more bytes after 'N', before our startup message",
                received.len() - 1
            ),
        }),
        [b'E', ..] => Ok(SslResponse::Error),
        [byte, ..] => Err(TlsError::BadSslResponse {
            detail: format!("byte 0x{byte:02x}, expected 'S' or 'N'"),
        }),
        [] => Err(TlsError::BadSslResponse {
            detail: "no response".into(),
        }),
    }
}

/// Sends SSLRequest and reads the answer. `Ok(None)` when the server closed the
/// connection instead of answering.
pub async fn request_ssl(tcp: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut request = bytes::BytesMut::with_capacity(8);
    postgres_protocol::message::frontend::ssl_request(&mut request);
    tcp.write_all(&request).await?;
    // One read: a well-behaved server sends exactly one byte and then waits for us. More
    // bytes in the same read are what CVE-2021-23222 is about.
    let mut answer = [0u8; 64];
    let n = tcp.read(&mut answer).await?;
    Ok((n > 0).then(|| answer.get(..n).unwrap_or_default().to_vec()))
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
    fn ssl_response_is_one_byte_and_nothing_after_it() {
        assert_eq!(parse_ssl_response(b"S").unwrap(), SslResponse::Accepted);
        assert_eq!(parse_ssl_response(b"N").unwrap(), SslResponse::Refused);
        assert_eq!(
            parse_ssl_response(b"E\0\0\0\x10SFATAL").unwrap(),
            SslResponse::Error
        );
        for injected in [&b"SR\0\0\0\x08\0\0\0\0"[..], b"SS"] {
            let err = parse_ssl_response(injected).unwrap_err().to_string();
            assert!(err.contains("CVE-2021-23222"), "{err}");
        }
        let err = parse_ssl_response(b"NZ").unwrap_err().to_string();
        assert!(err.contains("1 more bytes after 'N'"), "{err}");
        let err = parse_ssl_response(b"HTTP/1.1").unwrap_err().to_string();
        assert!(err.contains("0x48"), "{err}");
    }

    #[test]
    fn presented_names_are_shown_bare() {
        assert_eq!(
            presented_name("DnsName(\"db.example.com\")"),
            "db.example.com"
        );
        assert_eq!(presented_name("IpAddress(10.0.0.1)"), "10.0.0.1");
        assert_eq!(presented_name("db.example.com"), "db.example.com");
    }

    #[test]
    fn modes_parse_as_libpq_spells_them() {
        for mode in [
            SslMode::Disable,
            SslMode::Allow,
            SslMode::Prefer,
            SslMode::Require,
            SslMode::VerifyCa,
            SslMode::VerifyFull,
        ] {
            assert_eq!(SslMode::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(SslMode::parse("verify_full"), None);
        assert_eq!(SslMode::default(), SslMode::Prefer);
    }

    #[test]
    fn system_roots_need_verify_full() {
        for mode in [SslMode::Prefer, SslMode::Require, SslMode::VerifyCa] {
            let params = TlsParams {
                mode,
                root_cert: Some(RootCert::System),
                ..TlsParams::default()
            };
            let err = params.validate().unwrap_err().to_string();
            assert!(err.contains("use \"verify-full\""), "{err}");
        }
    }

    #[test]
    fn missing_files_are_named_with_the_parameter_to_set() {
        let params = TlsParams {
            mode: SslMode::VerifyFull,
            root_cert: Some(RootCert::File("/nonexistent/ca.pem".into())),
            ..TlsParams::default()
        };
        let err = params.load().unwrap_err().to_string();
        assert!(
            err.contains("sslrootcert file /nonexistent/ca.pem") && err.contains("set sslrootcert"),
            "{err}"
        );
        let params = TlsParams {
            mode: SslMode::Require,
            cert: Some("/nonexistent/client.crt".into()),
            ..TlsParams::default()
        };
        let err = params.load().unwrap_err().to_string();
        assert!(
            err.contains("sslcert file /nonexistent/client.crt"),
            "{err}"
        );
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let params = TlsParams {
            mode: SslMode::VerifyCa,
            root_cert: Some(RootCert::File(path)),
            ..TlsParams::default()
        };
        let err = params.load().unwrap_err().to_string();
        assert!(err.contains("holds no PEM certificate"), "{err}");
    }
}
