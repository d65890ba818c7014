//! The certificate and key files of [`super::TlsParams`]: PEM parsing, libpq's
//! `~/.postgresql` defaults, the system trust store, and libpq's rule on the key file's
//! permissions. Messages name the file and the parameter to set; never the key's bytes.

use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

use super::TlsError;

/// `~/.postgresql`, where libpq looks for default certificate files.
pub(super) fn home_postgresql_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(|home| PathBuf::from(home).join(".postgresql"))
}

fn read_file(param: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::ReadFile {
        param,
        path: path.to_owned(),
        source,
    })
}

pub(super) fn certificates_from_file(
    param: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_file(param, path)?;
    let no_certificate = |reason: Option<String>| TlsError::NoCertificate {
        param,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| no_certificate(Some(e.to_string())))?;
    if certs.is_empty() {
        return Err(no_certificate(None));
    }
    Ok(certs)
}

pub(super) fn roots_from_file(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates_from_file("sslrootcert", path)? {
        roots.add(cert).map_err(|e| TlsError::NoCertificate {
            param: "sslrootcert",
            path: path.to_owned(),
            reason: Some(format!(
                "a certificate cannot be used as a trust anchor: {e}"
            )),
        })?;
    }
    Ok(roots)
}

pub(super) fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let reason = match found.errors.first() {
            Some(error) => error.to_string(),
            None => "the store is empty".into(),
        };
        return Err(TlsError::SystemRoots { reason });
    }
    Ok(roots)
}

pub(super) fn key_from_file(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    check_key_permissions(path)?;
    let pem = read_file("sslkey", path)?;
    // An encrypted key (PKCS#8 "ENCRYPTED PRIVATE KEY", or a legacy "Proc-Type:
    // 4,ENCRYPTED" header) would need sslpassword. Only the labels are looked at.
    if pem.windows(9).any(|w| w == b"ENCRYPTED") {
        return Err(TlsError::EncryptedKey {
            path: path.to_owned(),
        });
    }
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsError::NoKey {
        path: path.to_owned(),
    })
}

/// libpq's rule: a key owned by the current user must not be readable by group or
/// others; one owned by root may be group-readable.
#[cfg(unix)]
fn check_key_permissions(path: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::MetadataExt;
    let metadata = std::fs::metadata(path).map_err(|source| TlsError::ReadFile {
        param: "sslkey",
        path: path.to_owned(),
        source,
    })?;
    let mode = metadata.mode() & 0o7777;
    let euid = effective_uid();
    let too_open =
        (metadata.uid() == euid && mode & 0o077 != 0) || (metadata.uid() == 0 && mode & 0o037 != 0);
    if too_open {
        return Err(TlsError::KeyPermissions {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_key_permissions(_path: &Path) -> Result<(), TlsError> {
    Ok(())
}

/// The effective user id, read from /proc/self/status (no libc dependency for one
/// call); the owner of /proc/self as a fallback.
#[cfg(unix)]
fn effective_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        if let Some(uid) = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|euid| euid.parse().ok())
        {
            return uid;
        }
    }
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn keys_readable_by_others_and_encrypted_keys_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("client.key");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = key_from_file(&key).unwrap_err().to_string();
        assert!(
            err.contains("group or world access") && err.contains("0644"),
            "{err}"
        );
        std::fs::write(
            &key,
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n",
        )
        .unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = key_from_file(&key).unwrap_err().to_string();
        assert!(err.contains("sslpassword is not supported"), "{err}");
        // The key's bytes never appear in the message.
        assert!(!err.contains("AAAA"), "{err}");
    }
}
