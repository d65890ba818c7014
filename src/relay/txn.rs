//! Transaction assembly: turns the decoded pgoutput stream into Begin / event / Commit
//! steps, keeping a relation cache that every Relation message refreshes.
//!
//! Protocol version 1 sends a transaction only after it committed, so events are handed
//! on as they are decoded; nothing is buffered per transaction and nothing is rolled back.
//!
//! Logical decoding messages (`pg_logical_emit_message`, [`crate::relay::messages`]):
//! a transactional one arrives between its transaction's Begin and Commit and is an
//! event of that transaction, in its place among the table events; a rolled-back
//! transaction is never decoded, so neither are its messages. A non-transactional one
//! arrives on its own, outside any Begin..Commit, at its own position: refused (logged
//! and counted) or, when configured, relayed as a transaction of its own whose end is
//! the message's position + 1 (PostgreSQL skips it on restart once that is
//! acknowledged).

use std::collections::HashMap;

use crate::pg::pgoutput::{PgOutputMessage, RelationBody};
use crate::pg::source::TablePattern;
use crate::pg::sql::QualifiedName;
use crate::pg::Lsn;
use crate::relay::messages::config::NonTransactional;
use crate::relay::messages::{MessageContext, MessageError, MessageRouter};
use crate::relay::router::{
    row_as_json, EventContext, OutboxEvent, ResolvedColumns, RouteError, Router,
};
use crate::sink::TxnSeq;

/// The Message flag bit of a transactional message.
const MESSAGE_TRANSACTIONAL: u8 = 1;

/// What the pipeline must do after one message.
#[derive(Debug)]
pub enum Step {
    /// A transaction began; register it with the ack tracker. `commit_ts_ms`: its
    /// commit time on PostgreSQL (protocol v1 sends a transaction after it committed).
    /// `final_lsn`: the LSN of its commit record (where the exactly-once checkpoint
    /// decides whether Kafka already has it).
    Begin {
        seq: TxnSeq,
        commit_ts_ms: i64,
        final_lsn: Lsn,
    },
    /// An outbox row of transaction `seq`, routed (or why it could not be).
    Event {
        seq: TxnSeq,
        event: Result<OutboxEvent, RoutedRowError>,
    },
    /// Transaction `seq` committed.
    Commit { seq: TxnSeq, end_lsn: Lsn },
    /// A relayed message of transaction `seq`, routed (or why it could not be).
    Message {
        seq: TxnSeq,
        event: Result<OutboxEvent, MessageError>,
    },
    /// A non-transactional message relayed on its own: transaction `seq` with this one
    /// record (or dead letter), ending at `end_lsn`.
    Standalone {
        seq: TxnSeq,
        event: Result<OutboxEvent, MessageError>,
        end_lsn: Lsn,
        timestamp_ms: i64,
    },
    /// A non-transactional message of a relayed prefix, refused
    /// (`[messages] non_transactional = "refuse"`).
    Refused { prefix: String, lsn: Lsn },
    /// A message whose prefix is not relayed.
    Ignored,
    /// Nothing to do (relation cache update, other tables, origin, type).
    Nothing,
}

/// A row of the outbox table that could not be routed, with where it came from.
///
/// `Display` and `Debug` leave the row's values out (never log row payloads); the row
/// itself is in `row_json`, for a dead-letter record.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("outbox row at {lsn} in {table}: {error}")]
pub struct RoutedRowError {
    pub table: String,
    pub lsn: Lsn,
    pub error: RouteError,
    /// The raw row as a JSON object of column name to text value
    /// ([`crate::relay::router::row_as_json`]).
    pub row_json: Vec<u8>,
}

impl std::fmt::Debug for RoutedRowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutedRowError")
            .field("table", &self.table)
            .field("lsn", &self.lsn)
            .field("error", &self.error)
            .field("row_json", &format_args!("<{} bytes>", self.row_json.len()))
            .finish()
    }
}

/// The stream broke the protocol's rules: definite, the relay stops.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssemblyError {
    #[error("{message} arrived outside a transaction")]
    OutsideTransaction { message: &'static str },
    #[error("Begin arrived inside transaction {xid}")]
    NestedBegin { xid: u32 },
    #[error("a non-transactional Message (at {lsn}) arrived inside transaction {xid}")]
    NonTransactionalInside { lsn: Lsn, xid: u32 },
    #[error("change for relation {relation_id} arrived before its Relation message")]
    UnknownRelation { relation_id: u32 },
    #[error("unexpected {message} message: the relay asks for protocol version 1 without streaming or two-phase")]
    Unexpected { message: &'static str },
    #[error("the outbox table {from} was renamed to {to} (relation id {relation_id}): inserts into it would no longer be recognised as events. Set its [outbox] table = \"{to}\" (or rename the table back) and restart; nothing after this point was acknowledged")]
    OutboxRenamed {
        relation_id: u32,
        from: String,
        to: String,
    },
    #[error("the publication sends inserts of {table} (relation id {relation_id}), which is not an outbox table of this relay ({outbox}): the relay cannot tell whether they hide outbox rows (a partition of the outbox published under its own name, or a table added to the relay's publication), so it stops without acknowledging them. For a partitioned outbox run ALTER PUBLICATION <publication> SET (publish_via_partition_root = true); otherwise remove the table from the relay's publication (ALTER PUBLICATION <publication> DROP TABLE {table}) and restart. PostgreSQL decodes rows with the publication as it was when they were written, so rows already written this way stop the relay again: re-send them from the outbox table, then move the slot past them with pg_replication_slot_advance")]
    ForeignRelation {
        table: String,
        relation_id: u32,
        outbox: String,
    },
}

/// One outbox table as the assembler knows it.
#[derive(Debug, Clone)]
pub struct AssemblerOutbox {
    pub table: QualifiedName,
    /// Its relation id when the relay started (`pg_class` OID).
    pub oid: u32,
    pub router: Router,
    /// The configuration entry it belongs to (its place in the list), for metrics.
    pub entry: usize,
}

/// A schema-per-tenant entry: a table its pattern matches that appears in the stream
/// (added to the publication while the relay runs) becomes an outbox with its router.
#[derive(Debug, Clone)]
pub struct AssemblerPattern {
    pub pattern: TablePattern,
    pub router: Router,
    pub entry: usize,
}

struct CachedRelation {
    /// Which outbox the relation is (an index into the assembler's outboxes), and its
    /// columns as that outbox's router resolved them; `None`: not an outbox.
    outbox: Option<(usize, ResolvedColumns)>,
    display_name: String,
    /// Column names in relation order, for the dead-letter copy of unroutable rows.
    column_names: Vec<String>,
}

#[derive(Debug, Clone, Copy)]
struct OpenTxn {
    seq: TxnSeq,
    xid: u32,
    final_lsn: Lsn,
    commit_ts_ms: i64,
}

/// Begin..Commit assembly with a relation cache.
///
/// Each outbox is known by its relation id (its `pg_class` OID, read when the relay
/// started) and its name: a Relation message with the id under another name is a rename
/// (an error), the name under another id is still that outbox (a table replaced, or the
/// old one decoded by the name it had), and an insert into any other relation stops the
/// relay (it could be outbox rows published under a partition's name). A Relation
/// message picks the outbox, and so the router, of the inserts that follow it.
pub struct TxnAssembler {
    outboxes: Vec<AssemblerOutbox>,
    patterns: Vec<AssemblerPattern>,
    relations: HashMap<u32, CachedRelation>,
    open: Option<OpenTxn>,
    next_seq: TxnSeq,
    /// `[messages]`; `None`: messages are not asked for (any that come are passed over).
    messages: Option<MessageRouter>,
}

impl TxnAssembler {
    /// `outboxes`: the tables relayed (none: a table-less deployment, messages only).
    pub fn new(outboxes: Vec<AssemblerOutbox>, first_seq: TxnSeq) -> Self {
        TxnAssembler {
            outboxes,
            patterns: Vec::new(),
            relations: HashMap::new(),
            open: None,
            next_seq: first_seq,
            messages: None,
        }
    }

    /// Relay the tables these patterns match, as they appear in the stream.
    pub fn with_patterns(mut self, patterns: Vec<AssemblerPattern>) -> Self {
        self.patterns = patterns;
        self
    }

    /// The table of [`OutboxEvent::outbox`](crate::event::OutboxEvent::outbox) `index`.
    pub fn table_of(&self, index: u32) -> Option<&QualifiedName> {
        let index = usize::try_from(index).ok()?;
        self.outboxes.get(index).map(|o| &o.table)
    }

    /// The configuration entry of [`OutboxEvent::outbox`](crate::event::OutboxEvent::outbox) `index`.
    pub fn entry_of(&self, index: u32) -> Option<usize> {
        let index = usize::try_from(index).ok()?;
        self.outboxes.get(index).map(|o| o.entry)
    }

    /// Relay logical decoding messages by these rules.
    pub fn with_messages(mut self, messages: Option<MessageRouter>) -> Self {
        self.messages = messages;
        self
    }

    /// The outbox tables, as messages name them.
    fn tables_shown(&self) -> String {
        let names: Vec<String> = self
            .outboxes
            .iter()
            .map(|o| o.table.to_string())
            .chain(self.patterns.iter().map(|p| p.pattern.to_string()))
            .collect();
        names.join(", ")
    }

    /// The sequence number the next transaction will get.
    pub fn next_seq(&self) -> TxnSeq {
        self.next_seq
    }

    /// Apply one message. `wal_start` is the XLogData header's start position.
    pub fn apply(
        &mut self,
        message: PgOutputMessage,
        wal_start: Lsn,
    ) -> Result<Step, AssemblyError> {
        match message {
            PgOutputMessage::Begin {
                final_lsn,
                commit_ts,
                xid,
            } => {
                if let Some(open) = self.open {
                    return Err(AssemblyError::NestedBegin { xid: open.xid });
                }
                let seq = self.next_seq;
                self.next_seq += 1;
                let commit_ts_ms = commit_ts.unix_millis();
                self.open = Some(OpenTxn {
                    seq,
                    xid,
                    final_lsn,
                    commit_ts_ms,
                });
                Ok(Step::Begin {
                    seq,
                    commit_ts_ms,
                    final_lsn,
                })
            }
            PgOutputMessage::Commit { end_lsn, .. } => {
                let open = self
                    .open
                    .take()
                    .ok_or(AssemblyError::OutsideTransaction { message: "Commit" })?;
                Ok(Step::Commit {
                    seq: open.seq,
                    end_lsn,
                })
            }
            PgOutputMessage::Relation(body) => {
                self.cache_relation(body)?;
                Ok(Step::Nothing)
            }
            PgOutputMessage::Insert {
                relation_id,
                new_tuple,
                ..
            } => {
                let open = self
                    .open
                    .ok_or(AssemblyError::OutsideTransaction { message: "Insert" })?;
                let relation = self
                    .relations
                    .get(&relation_id)
                    .ok_or(AssemblyError::UnknownRelation { relation_id })?;
                let Some((index, columns)) = &relation.outbox else {
                    return Err(AssemblyError::ForeignRelation {
                        table: relation.display_name.clone(),
                        relation_id,
                        outbox: self.tables_shown(),
                    });
                };
                // Insert messages carry their record's position; fall back to the commit's.
                let lsn = if wal_start.is_zero() {
                    open.final_lsn
                } else {
                    wal_start
                };
                let context = EventContext {
                    lsn,
                    commit_ts_ms: open.commit_ts_ms,
                };
                let outbox = u32::try_from(*index).unwrap_or(u32::MAX);
                let event = self.outboxes[*index]
                    .router
                    .route(columns, &new_tuple, context)
                    .map(|mut event| {
                        event.outbox = outbox;
                        event
                    })
                    .map_err(|error| RoutedRowError {
                        table: relation.display_name.clone(),
                        lsn,
                        error,
                        row_json: row_as_json(&relation.column_names, &new_tuple),
                    });
                Ok(Step::Event {
                    seq: open.seq,
                    event,
                })
            }
            // The publication asks for inserts only; updates and deletes (a publication
            // changed by hand) are not events.
            PgOutputMessage::Update { .. } | PgOutputMessage::Delete { .. } => Ok(Step::Nothing),
            PgOutputMessage::Message {
                flags,
                lsn,
                prefix,
                content,
                ..
            } => self.message(flags & MESSAGE_TRANSACTIONAL != 0, lsn, prefix, &content),
            PgOutputMessage::Origin { .. }
            | PgOutputMessage::Type { .. }
            | PgOutputMessage::Truncate { .. } => Ok(Step::Nothing),
            PgOutputMessage::StreamStart { .. } => Err(AssemblyError::Unexpected {
                message: "Stream Start",
            }),
            PgOutputMessage::StreamStop => Err(AssemblyError::Unexpected {
                message: "Stream Stop",
            }),
            PgOutputMessage::StreamCommit { .. } => Err(AssemblyError::Unexpected {
                message: "Stream Commit",
            }),
            PgOutputMessage::StreamAbort { .. } => Err(AssemblyError::Unexpected {
                message: "Stream Abort",
            }),
            PgOutputMessage::StreamPrepare { .. } => Err(AssemblyError::Unexpected {
                message: "Stream Prepare",
            }),
            PgOutputMessage::BeginPrepare { .. } => Err(AssemblyError::Unexpected {
                message: "Begin Prepare",
            }),
            PgOutputMessage::Prepare { .. } => {
                Err(AssemblyError::Unexpected { message: "Prepare" })
            }
            PgOutputMessage::CommitPrepared { .. } => Err(AssemblyError::Unexpected {
                message: "Commit Prepared",
            }),
            PgOutputMessage::RollbackPrepared { .. } => Err(AssemblyError::Unexpected {
                message: "Rollback Prepared",
            }),
        }
    }

    fn message(
        &mut self,
        transactional: bool,
        lsn: Lsn,
        prefix: String,
        content: &bytes::Bytes,
    ) -> Result<Step, AssemblyError> {
        let Some(messages) = &self.messages else {
            return Ok(Step::Ignored);
        };
        if transactional {
            let open = self.open.ok_or(AssemblyError::OutsideTransaction {
                message: "transactional Message",
            })?;
            let context = MessageContext {
                lsn,
                timestamp_ms: open.commit_ts_ms,
            };
            return Ok(match messages.route(&prefix, content, context) {
                None => Step::Ignored,
                Some(event) => Step::Message {
                    seq: open.seq,
                    event,
                },
            });
        }
        if let Some(open) = self.open {
            return Err(AssemblyError::NonTransactionalInside { lsn, xid: open.xid });
        }
        if messages.topic(&prefix).is_none() {
            return Ok(Step::Ignored);
        }
        if messages.non_transactional() == NonTransactional::Refuse {
            return Ok(Step::Refused { prefix, lsn });
        }
        let timestamp_ms = crate::metrics::unix_ms_now().try_into().unwrap_or(i64::MAX);
        let context = MessageContext { lsn, timestamp_ms };
        let Some(event) = messages.route(&prefix, content, context) else {
            return Ok(Step::Ignored);
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(Step::Standalone {
            seq,
            event,
            end_lsn: Lsn(lsn.0.saturating_add(1)),
            timestamp_ms,
        })
    }

    fn cache_relation(&mut self, body: RelationBody) -> Result<(), AssemblyError> {
        let named = |outbox: &AssemblerOutbox| {
            body.namespace == outbox.table.schema && body.name == outbox.table.name
        };
        let by_id = self.outboxes.iter().position(|o| o.oid == body.relation_id);
        if let Some(index) = by_id {
            let outbox = &self.outboxes[index];
            if !named(outbox) {
                return Err(AssemblyError::OutboxRenamed {
                    relation_id: body.relation_id,
                    from: outbox.table.to_string(),
                    to: format!("{}.{}", body.namespace, body.name),
                });
            }
        }
        // An outbox's name under another relation id: rows of a table the application
        // wrote to as that outbox, published at the time (a stream replayed past a
        // drop-and-recreate decodes the old table by the name it had then). They are
        // events. Whether the publication still covers the outbox as it did is the
        // outbox watch's question (crate::relay::watch), which also bounds every
        // acknowledgement.
        let index = by_id
            .or_else(|| self.outboxes.iter().position(named))
            .or_else(|| self.adopt(&body));
        let cached = CachedRelation {
            outbox: index.map(|i| (i, self.outboxes[i].router.resolve(&body))),
            display_name: format!("{}.{}", body.namespace, body.name),
            column_names: if index.is_some() {
                body.columns.iter().map(|c| c.name.clone()).collect()
            } else {
                Vec::new()
            },
        };
        self.relations.insert(body.relation_id, cached);
        Ok(())
    }

    /// A table a pattern matches, published while the relay ran (the outbox watch added
    /// it, or whoever provisions tenants did): an outbox from now on. Its index.
    fn adopt(&mut self, body: &RelationBody) -> Option<usize> {
        let pattern = self
            .patterns
            .iter()
            .find(|p| p.pattern.matches(&body.namespace, &body.name))?;
        let table = QualifiedName {
            schema: body.namespace.clone(),
            name: body.name.clone(),
        };
        tracing::info!(%table, pattern = %pattern.pattern, relation_id = body.relation_id, "a new outbox table of a pattern is in the stream");
        self.outboxes.push(AssemblerOutbox {
            table,
            oid: body.relation_id,
            router: pattern.router.clone(),
            entry: pattern.entry,
        });
        Some(self.outboxes.len() - 1)
    }
}

#[cfg(test)]
mod tests;
