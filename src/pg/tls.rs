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
//!
//! This file turns the URL's settings into a configuration ([`TlsParams::load`]) and
//! holds [`TlsError`]; `tls/ssl_request.rs` is the plaintext exchange before TLS,
//! `tls/verify.rs` the handshake and the certificate verifier, `tls/files.rs` the
//! certificate and key files, `tls/stream.rs` the session's byte stream.

mod files;
mod ssl_request;
mod stream;
mod verify;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ClientConfig;
use tokio_rustls::TlsConnector;

use files::{
    certificates_from_file, home_postgresql_dir, key_from_file, roots_from_file, system_roots,
};
pub use ssl_request::{parse_ssl_response, request_ssl, SslResponse};
pub use stream::PgStream;
pub use verify::HandshakeError;
use verify::PgCertVerifier;

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

#[cfg(test)]
mod tests {
    use super::*;

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
