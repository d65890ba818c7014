//! A throwaway PKI for TLS tests, made with `rcgen`: a CA, server certificates it signs
//! for chosen names, client certificates for chosen users, and an unrelated CA that
//! trusts none of them. Everything is written as PEM files into a temp dir (keys with
//! mode 0600, as libpq and the relay require), removed on drop.
//!
//! ```text
//! ca.pem ──signs──▶ server-<label>.pem / .key   (subjectAltName = the given names)
//!        └─signs──▶ client-<user>.pem / .key    (CN = the user, for pg_hba `cert`)
//! other-ca.pem                                   (signs nothing we use: "wrong CA")
//! ```

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tempfile::TempDir;

use crate::pg::ServerTls;

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct TestPki {
    ca: Issuer<'static, KeyPair>,
    ca_file: PathBuf,
    other_ca_file: PathBuf,
    // Last: removed after use.
    dir: TempDir,
}

impl TestPki {
    /// A new CA and an unrelated one, in a fresh temp dir.
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-pki-")
            .tempdir()
            .expect("creating the PKI temp dir");
        let (ca, ca_pem) = new_ca("outbox-relay test CA");
        let (_other, other_pem) = new_ca("an unrelated CA");
        let ca_file = dir.path().join("ca.pem");
        let other_ca_file = dir.path().join("other-ca.pem");
        write(&ca_file, &ca_pem, 0o644);
        write(&other_ca_file, &other_pem, 0o644);
        TestPki {
            ca,
            ca_file,
            other_ca_file,
            dir,
        }
    }

    /// The CA that signs every certificate made here (`sslrootcert`, the server's
    /// `ssl_ca_file`).
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// A CA that signed none of them.
    pub fn other_ca_file(&self) -> &Path {
        &self.other_ca_file
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A server certificate for `names` (DNS names or IP addresses, as subjectAltNames),
    /// signed by the CA. `label` names the files.
    pub fn server_cert(&self, label: &str, names: &[&str]) -> CertFiles {
        let mut params = CertificateParams::new(
            names
                .iter()
                .map(|name| (*name).to_owned())
                .collect::<Vec<_>>(),
        )
        .expect("valid subjectAltNames");
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or(label));
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(&format!("server-{label}"), &params)
    }

    /// A client certificate whose Common Name is `user` (what pg_hba's `cert` method
    /// compares with the user name), signed by the CA.
    pub fn client_cert(&self, user: &str) -> CertFiles {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.distinguished_name.push(DnType::CommonName, user);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(&format!("client-{user}"), &params)
    }

    /// The server side of `server`: its certificate and key, and the CA to check
    /// client certificates with.
    pub fn server_tls(&self, server: &CertFiles) -> ServerTls {
        ServerTls {
            cert_file: server.cert.clone(),
            key_file: server.key.clone(),
            ca_file: Some(self.ca_file.clone()),
        }
    }

    fn issue(&self, stem: &str, params: &CertificateParams) -> CertFiles {
        let key = KeyPair::generate().expect("generating a key");
        let cert = params
            .signed_by(&key, &self.ca)
            .unwrap_or_else(|err| panic!("signing {stem}: {err}"));
        let files = CertFiles {
            cert: self.dir.path().join(format!("{stem}.pem")),
            key: self.dir.path().join(format!("{stem}.key")),
        };
        write(&files.cert, &cert.pem(), 0o644);
        write(&files.key, &key.serialize_pem(), 0o600);
        files
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

fn new_ca(name: &str) -> (Issuer<'static, KeyPair>, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().expect("generating the CA key");
    let cert = params
        .self_signed(&key)
        .unwrap_or_else(|err| panic!("self-signing {name}: {err}"));
    (Issuer::new(params, key), cert.pem())
}

fn write(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap_or_else(|err| panic!("writing {}: {err}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|err| panic!("chmod {}: {err}", path.display()));
}
