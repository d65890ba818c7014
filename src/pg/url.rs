//! Connection URLs in libpq URI form: `postgres://user:password@host:port/dbname?param=value`.
//!
//! This file holds what a URL gives a connection ([`ConnectParams`], the password as a
//! [`Secret`], where the URL came from); `url/parse.rs` reads the URI text
//! ([`ConnectParams::from_url`]).

mod parse;

use std::fmt;

use crate::pg::tls::TlsParams;
pub use parse::UrlError;

/// A secret string whose `Debug` and `Display` never show the value.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// Read from the configuration as a plain string.
impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret::new)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"***\"")
    }
}

/// Which server of several (`host=a,b`) a session may use, as libpq's
/// `target_session_attrs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSession {
    /// The first server that accepts the connection.
    Any,
    /// The first one that accepts writes (`read-write`, or `primary`): after a failover,
    /// the promoted standby.
    ReadWrite,
}

/// Where and as whom to connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// The first server to try.
    pub host: String,
    pub port: u16,
    /// Further servers, tried in order when the ones before fail (libpq multi-host
    /// URLs: `postgres://h1:5432,h2:5432/app`).
    pub fallback_hosts: Vec<(String, u16)>,
    pub target_session: TargetSession,
    pub user: String,
    pub password: Option<Secret>,
    pub dbname: String,
    pub application_name: String,
    pub connect_timeout_secs: u64,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey` ([`crate::pg::tls`]).
    pub tls: TlsParams,
    /// Which setting gave this URL: connection errors name it as the thing to fix.
    pub origin: UrlOrigin,
}

/// Where a connection's URL came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UrlOrigin {
    /// `[postgres] url` of the configuration (with its password settings).
    #[default]
    Config,
    /// A command's `--admin-url`.
    AdminUrl,
}

impl UrlOrigin {
    /// The setting that names the server.
    pub fn setting(self) -> &'static str {
        match self {
            UrlOrigin::Config => "[postgres] url",
            UrlOrigin::AdminUrl => "--admin-url",
        }
    }

    /// Where the user and the password of this connection come from.
    pub fn credentials(self) -> &'static str {
        match self {
            UrlOrigin::Config => "[postgres] url, password or password_file, OUTBOX_RELAY__POSTGRES__PASSWORD, or PGPASSWORD when none is set",
            UrlOrigin::AdminUrl => "--admin-url, or PGPASSWORD when that URL has no password",
        }
    }
}

/// The default port of PostgreSQL.
pub const DEFAULT_PORT: u16 = 5432;
/// libpq has no connect timeout by default; a relay should not hang forever on a dead host.
pub const DEFAULT_CONNECT_TIMEOUT_SECS: u64 = 10;

impl ConnectParams {
    /// Every server to try, in order.
    pub fn hosts(&self) -> impl Iterator<Item = (&str, u16)> {
        std::iter::once((self.host.as_str(), self.port))
            .chain(self.fallback_hosts.iter().map(|(h, p)| (h.as_str(), *p)))
    }

    /// The URL with the password hidden, for logs and error messages.
    pub fn redacted(&self) -> String {
        let hosts: Vec<String> = self
            .hosts()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect();
        format!(
            "postgres://{}{}@{}/{}",
            self.user,
            if self.password.is_some() { ":***" } else { "" },
            hosts.join(","),
            self.dbname
        )
    }
}
