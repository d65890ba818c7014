//! Opening a session: the servers of the URL tried in order (with
//! `target_session_attrs=read-write`, until one accepts writes), `sslmode`'s one or two
//! attempts per server, TCP and the SSLRequest exchange, the startup message, the
//! authentication exchange (decided by the pure [`crate::pg::auth`]) and the wait for
//! ReadyForQuery. Apart from `conn.rs`, which holds the open session (queries, CopyBoth,
//! close), because the choice of server and of TLS is a policy of its own, with its own
//! fallbacks and errors, that ends once the session is ready.

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::net::TcpStream;

use super::error::server_error;
use super::{PgConnection, PgError, SessionKind};
use crate::pg::auth::{AuthError, AuthStep, Authenticator};
use crate::pg::tls::{self, HandshakeError, PgStream, SslMode, SslResponse, TlsError, TlsSetup};
use crate::pg::url::{ConnectParams, TargetSession, UrlOrigin};

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
