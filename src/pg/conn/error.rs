//! What can go wrong on a PostgreSQL connection: [`PgError`], and [`DbError`], a
//! server's ErrorResponse or NoticeResponse with its SQLSTATE. Apart from the
//! connection's code because every layer above names these types (the diagnosis reads
//! them, the relay matches them) while only `conn` moves bytes; whether an error is
//! transient is decided in [`crate::pg::diagnose`].

use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::ErrorFields;

use crate::pg::replication::FrameError;
use crate::pg::tls::TlsError;
use crate::pg::url::UrlOrigin;

/// An error reported by the server (ErrorResponse), with its SQLSTATE.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DbError {
    pub severity: String,
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (SQLSTATE {})",
            self.severity, self.message, self.code
        )?;
        if let Some(detail) = &self.detail {
            write!(f, "; detail: {detail}")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "; hint: {hint}")?;
        }
        Ok(())
    }
}

impl DbError {
    pub(super) fn from_fields(mut fields: ErrorFields<'_>) -> Self {
        let mut error = DbError::default();
        while let Ok(Some(field)) = fields.next() {
            let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
            match field.type_() {
                b'V' => error.severity = value,
                b'S' if error.severity.is_empty() => error.severity = value,
                b'C' => error.code = value,
                b'M' => error.message = value,
                b'D' => error.detail = Some(value),
                b'H' => error.hint = Some(value),
                _ => {}
            }
        }
        error
    }
}

/// Everything that can go wrong on a PostgreSQL connection.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("could not connect to PostgreSQL at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out after {secs} s connecting to PostgreSQL at {addr}")]
    ConnectTimeout { addr: String, secs: u64 },
    #[error("authentication failed for user {user:?} at {addr}: {reason}; check the user and password ({}) and the server's pg_hba.conf (for a client certificate: sslcert and sslkey)", origin.credentials())]
    Authentication {
        user: String,
        addr: String,
        reason: String,
        origin: UrlOrigin,
    },
    #[error("PostgreSQL connection lost: {0}")]
    Io(#[from] std::io::Error),
    #[error("PostgreSQL at {addr} closed the connection")]
    Closed { addr: String },
    #[error("PostgreSQL error: {0}")]
    Db(DbError),
    #[error("protocol error on the PostgreSQL connection: {0}")]
    Protocol(String),
    #[error("the server at {addr} does not speak the PostgreSQL protocol ({reason}): check host and port in {}", origin.setting())]
    NotPostgres {
        addr: String,
        reason: String,
        origin: UrlOrigin,
    },
    #[error("bad replication frame from PostgreSQL: {0}")]
    Frame(#[from] FrameError),
    /// The TLS settings of `[postgres] url` cannot be used (a file is missing, ...).
    #[error("TLS to PostgreSQL: {0}")]
    TlsConfig(TlsError),
    /// TLS with one server failed (not trusted, wrong name, refused, ...).
    #[error("TLS to PostgreSQL at {addr}: {source}")]
    Tls {
        addr: String,
        #[source]
        source: TlsError,
    },
    #[error("no server in {} accepts writes ({tried}): target_session_attrs=read-write waits for a primary (a failover in progress?)", origin.setting())]
    NoPrimary { tried: String, origin: UrlOrigin },
}

impl PgError {
    /// The SQLSTATE of a server error, if this is one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            PgError::Db(db) => Some(&db.code),
            _ => None,
        }
    }
}

/// An ErrorResponse as an error; one without severity, SQLSTATE and message is not
/// something PostgreSQL sends.
pub(super) fn server_error(fields: ErrorFields<'_>) -> PgError {
    let error = DbError::from_fields(fields);
    if error.code.is_empty() && error.message.is_empty() {
        return PgError::Protocol("an ErrorResponse without severity, SQLSTATE or message".into());
    }
    PgError::Db(error)
}
