//! A PostgreSQL connection on tokio and `postgres-protocol`: TLS negotiation
//! ([`crate::pg::tls`], libpq's `sslmode`), startup, authentication (decided by the pure
//! [`crate::pg::auth`]), the simple query protocol, and CopyBoth for logical
//! replication. Replication and SQL sessions connect through the same code.
//!
//! Backend messages are framed by the pure [`crate::pg::framing`] module (where the
//! untrusted lengths are checked, and CopyBothResponse, unknown to `postgres-protocol`
//! 0.6, is taken); this module only moves bytes and drives the protocol's states.

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::{ErrorFields, Message};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::pg::tls::{self, HandshakeError, PgStream, SslMode, SslResponse, TlsError, TlsSetup};

use crate::pg::replication::{FrameError, ReplicationFrame, StandbyStatusUpdate};
use crate::pg::url::{ConnectParams, TargetSession, UrlOrigin};

use crate::pg::auth::{AuthError, AuthStep, Authenticator};
pub use crate::pg::framing::MAX_MESSAGE_LEN;
use crate::pg::framing::{self, Backend};

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
    fn from_fields(mut fields: ErrorFields<'_>) -> Self {
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
    /// The TLS settings of [postgres] url cannot be used (a file is missing, ...).
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

/// Rows of a simple query, all values in text format.
#[derive(Debug, Clone, Default)]
pub struct QueryResult {
    pub columns: Vec<String>,
    /// The type of each column (`pg_type` OID), in the order of `columns`.
    pub column_types: Vec<u32>,
    pub rows: Vec<Vec<Option<String>>>,
}

impl QueryResult {
    /// The value of `column` in row `row`, or `None` when absent or NULL.
    pub fn get(&self, row: usize, column: &str) -> Option<&str> {
        let index = self.columns.iter().position(|c| c == column)?;
        self.rows.get(row)?.get(index)?.as_deref()
    }
}

/// What the server sent while the connection is in CopyBoth mode.
#[derive(Debug)]
pub enum CopyEvent {
    Frame(ReplicationFrame),
    /// A NoticeResponse (WARNING, NOTICE, ...) sent in the middle of the stream.
    Notice(DbError),
    /// The server ended the stream (CopyDone); the command completes after it.
    Done,
}

/// Which kind of session to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKind {
    /// An ordinary session.
    Sql,
    /// `replication=database`: replication commands and simple SQL on one database.
    LogicalReplication,
}

/// How one connection attempt starts, derived from `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Negotiation {
    /// StartupMessage right away.
    Plain,
    /// SSLRequest; on 'N', go on in plaintext on the same connection (prefer).
    TlsOrPlain,
    /// SSLRequest; on 'N', fail (require, verify-ca, verify-full, and allow's retry).
    TlsOnly,
}

/// One connection to PostgreSQL.
pub struct PgConnection {
    stream: PgStream,
    /// `host:port`, for error messages.
    addr: String,
    read_buf: BytesMut,
    write_buf: BytesMut,
    parameters: HashMap<String, String>,
    backend_pid: i32,
    in_copy_both: bool,
}

impl PgConnection {
    /// Connect and authenticate: to the first server of the URL that accepts the
    /// connection (and, with `target_session_attrs=read-write`, accepts writes), trying
    /// them in order like libpq. The connect timeout applies to each server.
    pub async fn connect(params: &ConnectParams, kind: SessionKind) -> Result<Self, PgError> {
        let tls = params.tls.load().map_err(PgError::TlsConfig)?;
        let mut last_error = None;
        let mut read_only = Vec::new();
        for (host, port) in params.hosts() {
            match Self::connect_one(params, kind, &tls, host, port).await {
                Ok(mut conn) => {
                    if params.target_session == TargetSession::ReadWrite
                        && conn.is_read_only().await?
                    {
                        read_only.push(conn.addr.clone());
                        continue;
                    }
                    return Ok(conn);
                }
                Err(error @ PgError::Authentication { .. }) => return Err(error),
                Err(error) => {
                    tracing::debug!(host, port, error = %error, "server not available");
                    last_error = Some(error);
                }
            }
        }
        if !read_only.is_empty() {
            let mut tried: Vec<String> = read_only
                .iter()
                .map(|addr| format!("{addr} is read-only"))
                .collect();
            if let Some(error) = &last_error {
                tried.push(error.to_string());
            }
            return Err(PgError::NoPrimary {
                tried: tried.join("; "),
                origin: params.origin,
            });
        }
        Err(last_error.unwrap_or_else(|| {
            PgError::Protocol(format!("no host in {}", params.origin.setting()))
        }))
    }

    /// Whether the session is read-only (a standby, or default_transaction_read_only).
    async fn is_read_only(&mut self) -> Result<bool, PgError> {
        let result = self.simple_query("SHOW transaction_read_only").await?;
        Ok(result
            .rows
            .first()
            .and_then(|r| r.first().cloned().flatten())
            .as_deref()
            == Some("on"))
    }

    /// One server: one attempt, or two as `sslmode` says (allow: plaintext, then TLS if
    /// the server refused the session; prefer: TLS, then plaintext if TLS failed). The
    /// connect timeout applies to each attempt. When both fail, the TLS attempt's error
    /// is returned (libpq reports both; the TLS one is the one to fix).
    async fn connect_one(
        params: &ConnectParams,
        kind: SessionKind,
        tls: &TlsSetup,
        host: &str,
        port: u16,
    ) -> Result<Self, PgError> {
        let attempt = |negotiation| Self::attempt(params, kind, tls, negotiation, host, port);
        match tls.mode {
            SslMode::Disable => attempt(Negotiation::Plain).await.map_err(|e| e.error),
            SslMode::Allow => match attempt(Negotiation::Plain).await {
                Err(plain_error) if refused_session(&plain_error.error) => {
                    tracing::debug!(host, port, error = %plain_error.error, "plaintext session refused, trying TLS (sslmode=allow)");
                    attempt(Negotiation::TlsOnly).await.map_err(|e| e.error)
                }
                other => other.map_err(|e| e.error),
            },
            SslMode::Prefer => match attempt(Negotiation::TlsOrPlain).await {
                Err(tls_error) if tls_failed(&tls_error) => {
                    let tls_error = tls_error.error;
                    tracing::debug!(host, port, error = %tls_error, "TLS session failed, trying plaintext (sslmode=prefer)");
                    attempt(Negotiation::Plain).await.map_err(|plain_error| {
                        tracing::debug!(host, port, error = %plain_error.error, "plaintext session failed too");
                        tls_error
                    })
                }
                other => other.map_err(|e| e.error),
            },
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                attempt(Negotiation::TlsOnly).await.map_err(|e| e.error)
            }
        }
    }

    async fn attempt(
        params: &ConnectParams,
        kind: SessionKind,
        tls: &TlsSetup,
        negotiation: Negotiation,
        host: &str,
        port: u16,
    ) -> Result<Self, AttemptError> {
        let addr = format!("{host}:{port}");
        let secs = params.connect_timeout_secs;
        let attempt = Self::connect_inner(params, kind, tls, negotiation, &addr, host, port);
        if secs == 0 {
            return attempt.await;
        }
        tokio::time::timeout(Duration::from_secs(secs), attempt)
            .await
            .map_err(|_| AttemptError {
                error: PgError::ConnectTimeout { addr, secs },
                over_tls: false,
            })?
    }

    /// TCP, then SSLRequest and the TLS handshake when `negotiation` asks for them. With
    /// the stream come the bytes of an ErrorResponse the server sent instead of its
    /// SSLRequest answer, if it did.
    async fn open_stream(
        tls: &TlsSetup,
        negotiation: Negotiation,
        addr: &str,
        (host, port): (&str, u16),
        origin: UrlOrigin,
    ) -> Result<(PgStream, Option<Vec<u8>>), PgError> {
        let mut tcp =
            TcpStream::connect((host, port))
                .await
                .map_err(|source| PgError::Connect {
                    addr: addr.to_owned(),
                    source,
                })?;
        tcp.set_nodelay(true)?;
        if negotiation == Negotiation::Plain {
            return Ok((PgStream::Plain(tcp), None));
        }
        let tls_error = |source| PgError::Tls {
            addr: addr.to_owned(),
            source,
        };
        let answer = tls::request_ssl(&mut tcp)
            .await?
            .ok_or_else(|| PgError::Closed {
                addr: addr.to_owned(),
            })?;
        let response = tls::parse_ssl_response(&answer).map_err(|error| match error {
            // Not an answer PostgreSQL gives: say so, with the address to check.
            TlsError::BadSslResponse { detail } => PgError::NotPostgres {
                addr: addr.to_owned(),
                reason: format!("invalid response to SSLRequest: {detail}"),
                origin,
            },
            other => tls_error(other),
        })?;
        match response {
            SslResponse::Accepted => match tls.handshake(tcp, host).await {
                Ok(stream) => Ok((PgStream::Tls(Box::new(stream)), None)),
                Err(HandshakeError::Tls(source)) => Err(tls_error(source)),
                Err(HandshakeError::Io(error)) => Err(PgError::Io(error)),
            },
            SslResponse::Refused if negotiation == Negotiation::TlsOrPlain => {
                Ok((PgStream::Plain(tcp), None))
            }
            SslResponse::Refused => Err(tls_error(TlsError::ServerRefusedTls { mode: tls.mode })),
            SslResponse::Error => Ok((PgStream::Plain(tcp), Some(answer))),
        }
    }

    async fn connect_inner(
        params: &ConnectParams,
        kind: SessionKind,
        tls: &TlsSetup,
        negotiation: Negotiation,
        addr: &str,
        host: &str,
        port: u16,
    ) -> Result<Self, AttemptError> {
        let (stream, error_response) =
            Self::open_stream(tls, negotiation, addr, (host, port), params.origin)
                .await
                .map_err(|error| AttemptError {
                    error,
                    over_tls: false,
                })?;
        let over_tls = stream.is_tls();
        let mut conn = PgConnection {
            stream,
            addr: addr.to_owned(),
            read_buf: BytesMut::with_capacity(64 * 1024),
            write_buf: BytesMut::with_capacity(1024),
            parameters: HashMap::new(),
            backend_pid: 0,
            in_copy_both: false,
        };
        let mut startup: Vec<(&str, &str)> = vec![
            ("user", &params.user),
            ("database", &params.dbname),
            ("application_name", &params.application_name),
            ("client_encoding", "UTF8"),
            // Values are decoded as text by the walsender with this session's settings;
            // the router reads ISO timestamps and hex bytea whatever the server default.
            ("options", "-c datestyle=ISO -c bytea_output=hex"),
        ];
        if kind == SessionKind::LogicalReplication {
            startup.push(("replication", "database"));
        }
        let handshake = async {
            if let Some(bytes) = error_response {
                // The server's answer to SSLRequest was an ErrorResponse (libpq reads it
                // as the session's error).
                conn.read_buf.extend_from_slice(&bytes);
                return Err(match conn.read_message().await? {
                    Message::ErrorResponse(body) => server_error(body.fields()),
                    _ => PgError::Protocol("unexpected message in answer to SSLRequest".into()),
                });
            }
            frontend::startup_message(startup, &mut conn.write_buf)?;
            conn.flush().await?;
            conn.authenticate(params).await?;
            conn.wait_ready().await
        };
        let error = match handshake.await {
            Ok(()) => return Ok(conn),
            // Garbage during the handshake: not PostgreSQL at all.
            Err(PgError::Protocol(reason)) => PgError::NotPostgres {
                addr: addr.to_owned(),
                reason,
                origin: params.origin,
            },
            // With TLS 1.3 the server's verdict on our certificate (an alert) arrives
            // after the handshake, on the first read.
            Err(PgError::Io(error)) if over_tls => match tls.classify(error, host) {
                HandshakeError::Tls(source) => PgError::Tls {
                    addr: addr.to_owned(),
                    source,
                },
                HandshakeError::Io(error) => PgError::Io(error),
            },
            Err(other) => other,
        };
        Err(AttemptError { error, over_tls })
    }

    /// The authentication phase: the pure [`Authenticator`] decides each reply, this
    /// moves the bytes.
    async fn authenticate(&mut self, params: &ConnectParams) -> Result<(), PgError> {
        let addr = self.addr.clone();
        let auth_error = |reason: String| PgError::Authentication {
            user: params.user.clone(),
            addr: addr.clone(),
            reason,
            origin: params.origin,
        };
        let password = params.password.as_ref().map(|p| p.expose().as_bytes());
        let mut authenticator = Authenticator::new(&params.user, password);
        loop {
            let message = self.read_message().await?;
            match authenticator.on_message(message, &mut self.write_buf) {
                Ok(AuthStep::Done) => return Ok(()),
                Ok(AuthStep::Reply) => self.flush().await?,
                Ok(AuthStep::Wait) => {}
                Ok(AuthStep::ServerError(body)) => {
                    return Err(match server_error(body.fields()) {
                        // 28P01 invalid_password, 28000 invalid_authorization_specification.
                        PgError::Db(error) if error.code.starts_with("28") => {
                            auth_error(error.message)
                        }
                        other => other,
                    });
                }
                Err(AuthError::Refused(reason)) => return Err(auth_error(reason)),
                Err(AuthError::Protocol(reason)) => return Err(PgError::Protocol(reason)),
            }
        }
    }

    /// After authentication: parameter statuses and backend key data until ReadyForQuery.
    async fn wait_ready(&mut self) -> Result<(), PgError> {
        loop {
            match self.read_message().await? {
                Message::ReadyForQuery(_) => return Ok(()),
                Message::ParameterStatus(body) => {
                    self.parameters
                        .insert(body.name()?.to_owned(), body.value()?.to_owned());
                }
                Message::BackendKeyData(body) => self.backend_pid = body.process_id(),
                Message::NoticeResponse(_) => {}
                Message::ErrorResponse(body) => return Err(server_error(body.fields())),
                _ => {
                    return Err(PgError::Protocol(
                        "unexpected message during startup".into(),
                    ))
                }
            }
        }
    }

    /// A server parameter reported at startup (`server_version`, ...).
    pub fn parameter(&self, name: &str) -> Option<&str> {
        self.parameters.get(name).map(String::as_str)
    }

    /// The server process id of this session.
    pub fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// Run one statement with the simple query protocol (also replication commands).
    /// Returns the rows of the last result set.
    pub async fn simple_query(&mut self, sql: &str) -> Result<QueryResult, PgError> {
        frontend::query(sql, &mut self.write_buf)?;
        self.flush().await?;
        let mut result = QueryResult::default();
        let mut error = None;
        loop {
            match self.read_message().await? {
                Message::RowDescription(body) => {
                    result = QueryResult::default();
                    let mut fields = body.fields();
                    while let Some(field) = fields.next()? {
                        result.columns.push(field.name().to_owned());
                        result.column_types.push(field.type_oid());
                    }
                }
                Message::DataRow(body) => {
                    let buffer = body.buffer();
                    let mut ranges = body.ranges();
                    let mut row = Vec::with_capacity(result.columns.len());
                    while let Some(range) = ranges.next()? {
                        row.push(match range {
                            Some(range) => {
                                let bytes = buffer.get(range).ok_or_else(|| {
                                    PgError::Protocol("DataRow value out of bounds".into())
                                })?;
                                Some(String::from_utf8_lossy(bytes).into_owned())
                            }
                            None => None,
                        });
                    }
                    result.rows.push(row);
                }
                Message::CommandComplete(_)
                | Message::EmptyQueryResponse
                | Message::NoticeResponse(_)
                | Message::ParameterStatus(_) => {}
                Message::ErrorResponse(body) => {
                    error = Some(server_error(body.fields()));
                }
                Message::ReadyForQuery(_) => {
                    return match error {
                        Some(error) => Err(error),
                        None => Ok(result),
                    };
                }
                Message::CopyOutResponse(_) | Message::CopyInResponse(_) => {
                    return Err(PgError::Protocol(format!(
                        "statement {sql:?} started a COPY, which simple_query does not handle"
                    )))
                }
                _ => return Err(PgError::Protocol("unexpected message in query".into())),
            }
        }
    }

    /// Send a command that enters CopyBoth mode (`START_REPLICATION ...`) and wait for
    /// the server to confirm it.
    pub async fn start_copy_both(&mut self, command: &str) -> Result<(), PgError> {
        frontend::query(command, &mut self.write_buf)?;
        self.flush().await?;
        loop {
            match framing::parse(&mut self.read_buf).map_err(framing_error)? {
                Some(Backend::CopyBothResponse) => {
                    self.in_copy_both = true;
                    return Ok(());
                }
                Some(Backend::Message(message)) => match message {
                    Message::NoticeResponse(_) | Message::ParameterStatus(_) => continue,
                    Message::ErrorResponse(body) => {
                        let error = server_error(body.fields());
                        // Drain to ReadyForQuery so the connection stays usable.
                        self.drain_until_ready().await?;
                        return Err(error);
                    }
                    _ => {
                        return Err(PgError::Protocol(
                            "unexpected message while starting replication".into(),
                        ))
                    }
                },
                None => self.fill().await?,
            }
        }
    }

    /// Next event of the CopyBoth stream. Cancel-safe: a partially received message
    /// stays in the buffer.
    pub async fn next_copy_event(&mut self) -> Result<CopyEvent, PgError> {
        loop {
            if let Some(event) = self.buffered_copy_event()? {
                return Ok(event);
            }
            self.fill().await?;
        }
    }

    /// The next event of the CopyBoth stream if it is already received whole, without
    /// reading from the socket.
    pub fn buffered_copy_event(&mut self) -> Result<Option<CopyEvent>, PgError> {
        while let Some(message) = self.try_parse_message()? {
            match message {
                Message::CopyData(body) => {
                    return Ok(Some(CopyEvent::Frame(ReplicationFrame::parse(
                        body.into_bytes(),
                    )?)))
                }
                // A walsender that ends streaming (server shutdown) may send
                // CommandComplete right away.
                Message::CopyDone | Message::CommandComplete(_) => {
                    self.in_copy_both = false;
                    return Ok(Some(CopyEvent::Done));
                }
                Message::NoticeResponse(body) => {
                    return Ok(Some(CopyEvent::Notice(DbError::from_fields(body.fields()))))
                }
                Message::ParameterStatus(_) => continue,
                Message::ErrorResponse(body) => return Err(server_error(body.fields())),
                other => {
                    return Err(PgError::Protocol(format!(
                        "unexpected {} message in the replication stream",
                        message_name(&other)
                    )))
                }
            }
        }
        Ok(None)
    }

    /// Send a standby status update.
    pub async fn send_status(&mut self, update: &StandbyStatusUpdate) -> Result<(), PgError> {
        let mut payload = BytesMut::with_capacity(StandbyStatusUpdate::LEN);
        update.encode(&mut payload);
        frontend::CopyData::new(payload.freeze())?.write(&mut self.write_buf);
        self.flush().await
    }

    /// Leave CopyBoth mode politely and close: CopyDone, wait (bounded) for the server's
    /// CopyDone and ReadyForQuery, then Terminate. Errors are ignored: this is shutdown.
    pub async fn close(mut self, wait: Duration) {
        let polite = async {
            if self.in_copy_both {
                frontend::copy_done(&mut self.write_buf);
                self.flush().await?;
                loop {
                    match self.next_copy_event().await {
                        Ok(CopyEvent::Done) => break,
                        Ok(CopyEvent::Frame(_) | CopyEvent::Notice(_)) => continue,
                        Err(e) => return Err(e),
                    }
                }
                self.drain_until_ready().await?;
            }
            Ok::<(), PgError>(())
        };
        let _ = tokio::time::timeout(wait, polite).await;
        frontend::terminate(&mut self.write_buf);
        let _ = tokio::time::timeout(wait, self.flush()).await;
        let _ = self.stream.shutdown().await;
    }

    async fn drain_until_ready(&mut self) -> Result<(), PgError> {
        loop {
            if let Message::ReadyForQuery(_) = self.read_message().await? {
                return Ok(());
            }
        }
    }

    async fn flush(&mut self) -> Result<(), PgError> {
        if !self.write_buf.is_empty() {
            self.stream.write_all(&self.write_buf).await?;
            self.write_buf.clear();
            // TLS buffers records until flushed; plain TCP's flush does nothing.
            self.stream.flush().await?;
        }
        Ok(())
    }

    async fn read_message(&mut self) -> Result<Message, PgError> {
        loop {
            if let Some(message) = self.try_parse_message()? {
                return Ok(message);
            }
            self.fill().await?;
        }
    }

    /// Read more bytes from the socket. Cancel-safe.
    async fn fill(&mut self) -> Result<(), PgError> {
        self.read_buf.reserve(64 * 1024);
        let n = self.stream.read_buf(&mut self.read_buf).await?;
        if n == 0 {
            return Err(PgError::Closed {
                addr: self.addr.clone(),
            });
        }
        Ok(())
    }

    /// The next complete message, or `None` when more bytes are needed. A
    /// CopyBothResponse is only expected by `start_copy_both`.
    fn try_parse_message(&mut self) -> Result<Option<Message>, PgError> {
        match framing::parse(&mut self.read_buf).map_err(framing_error)? {
            Some(Backend::Message(message)) => Ok(Some(message)),
            Some(Backend::CopyBothResponse) => {
                Err(PgError::Protocol("unexpected CopyBothResponse".into()))
            }
            None => Ok(None),
        }
    }
}

/// A failed connection attempt, and whether it had got as far as TLS.
struct AttemptError {
    error: PgError,
    over_tls: bool,
}

/// The server refused the session (an ErrorResponse during startup, e.g. no pg_hba.conf
/// line for a plaintext session): sslmode=allow then tries TLS.
fn refused_session(error: &PgError) -> bool {
    matches!(error, PgError::Db(_) | PgError::Authentication { .. })
}

/// TLS was tried and failed, in the handshake or by the server refusing the session
/// over TLS: sslmode=prefer then tries plaintext, as libpq does. Not after bytes that
/// were injected before the handshake or a response that is not PostgreSQL's.
fn tls_failed(attempt: &AttemptError) -> bool {
    match &attempt.error {
        PgError::Tls { source, .. } => !matches!(
            source,
            TlsError::UnencryptedDataAfterResponse | TlsError::BadSslResponse { .. }
        ),
        PgError::Db(_) | PgError::Authentication { .. } => attempt.over_tls,
        _ => false,
    }
}

fn framing_error(error: framing::FramingError) -> PgError {
    PgError::Protocol(error.to_string())
}

/// An ErrorResponse as an error; one without severity, SQLSTATE and message is not
/// something PostgreSQL sends.
fn server_error(fields: ErrorFields<'_>) -> PgError {
    let error = DbError::from_fields(fields);
    if error.code.is_empty() && error.message.is_empty() {
        return PgError::Protocol("an ErrorResponse without severity, SQLSTATE or message".into());
    }
    PgError::Db(error)
}

/// A backend message's name, for error messages.
fn message_name(message: &Message) -> &'static str {
    match message {
        Message::CommandComplete(_) => "CommandComplete",
        Message::ReadyForQuery(_) => "ReadyForQuery",
        Message::RowDescription(_) => "RowDescription",
        Message::DataRow(_) => "DataRow",
        Message::EmptyQueryResponse => "EmptyQueryResponse",
        Message::NotificationResponse(_) => "NotificationResponse",
        Message::CopyInResponse(_) => "CopyInResponse",
        Message::CopyOutResponse(_) => "CopyOutResponse",
        Message::BackendKeyData(_) => "BackendKeyData",
        Message::AuthenticationOk => "AuthenticationOk",
        _ => "backend",
    }
}
