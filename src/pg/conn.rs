//! A PostgreSQL connection on tokio and `postgres-protocol`: TLS negotiation
//! ([`crate::pg::tls`], libpq's `sslmode`), startup, authentication (decided by the pure
//! [`crate::pg::auth`]), the simple query protocol, and CopyBoth for logical
//! replication. Replication and SQL sessions connect through the same code.
//!
//! Backend messages are framed by the pure [`crate::pg::framing`] module (where the
//! untrusted lengths are checked, and CopyBothResponse, unknown to `postgres-protocol`
//! 0.6, is taken); this module only moves bytes and drives the protocol's states.
//!
//! Three files: `conn/connect.rs` opens a session (servers in order, `sslmode`'s
//! attempts, startup, authentication), `conn/error.rs` holds [`PgError`] and
//! [`DbError`], and this one the open session: queries, CopyBoth, close, and the reads
//! and writes under them.

mod connect;
mod error;

use std::collections::HashMap;
use std::time::Duration;

use bytes::BytesMut;
use fallible_iterator::FallibleIterator;
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::pg::tls::PgStream;

use crate::pg::replication::{ReplicationFrame, StandbyStatusUpdate};

pub use crate::pg::framing::MAX_MESSAGE_LEN;
use crate::pg::framing::{self, Backend};
use error::server_error;
pub use error::{DbError, PgError};

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

fn framing_error(error: framing::FramingError) -> PgError {
    PgError::Protocol(error.to_string())
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
