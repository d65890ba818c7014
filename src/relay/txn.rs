//! Transaction assembly: turns the decoded pgoutput stream into Begin / event / Commit
//! steps, keeping a relation cache that every Relation message refreshes.
//!
//! Protocol version 1 sends a transaction only after it committed, so events are handed
//! on as they are decoded; nothing is buffered per transaction and nothing is rolled back.

use std::collections::HashMap;

use crate::pg::pgoutput::{PgOutputMessage, RelationBody};
use crate::pg::sql::QualifiedName;
use crate::pg::Lsn;
use crate::relay::router::{
    row_as_json, EventContext, OutboxEvent, ResolvedColumns, RouteError, Router,
};
use crate::sink::TxnSeq;

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
    /// ([`row_as_json`](crate::relay::router::row_as_json)).
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
    #[error("change for relation {relation_id} arrived before its Relation message")]
    UnknownRelation { relation_id: u32 },
    #[error("unexpected {message} message: the relay asks for protocol version 1 without streaming or two-phase")]
    Unexpected { message: &'static str },
    #[error("the outbox table {from} was renamed to {to} (relation id {relation_id}): inserts into it would no longer be recognised as events. Set [outbox] table = \"{to}\" (or rename the table back) and restart; nothing after this point was acknowledged")]
    OutboxRenamed {
        relation_id: u32,
        from: String,
        to: String,
    },
    #[error("the publication sends inserts of {table} (relation id {relation_id}), which is not the outbox table {outbox}: the relay cannot tell whether they hide outbox rows (a partition of the outbox published under its own name, or a table added to the relay's publication), so it stops without acknowledging them. For a partitioned outbox run ALTER PUBLICATION <publication> SET (publish_via_partition_root = true); otherwise remove the table from the relay's publication (ALTER PUBLICATION <publication> DROP TABLE {table}) and restart. PostgreSQL decodes rows with the publication as it was when they were written, so rows already written this way stop the relay again: re-send them from the outbox table, then move the slot past them with pg_replication_slot_advance")]
    ForeignRelation {
        table: String,
        relation_id: u32,
        outbox: String,
    },
}

struct CachedRelation {
    is_outbox: bool,
    display_name: String,
    columns: ResolvedColumns,
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
/// The outbox is known by its relation id (its `pg_class` OID, read when the relay
/// started) and its name: a Relation message with the id under another name is a rename
/// (an error), the name under another id is still the outbox (a table replaced, or the
/// old one decoded by the name it had), and an insert into any other relation stops the
/// relay (it could be outbox rows published under a partition's name).
pub struct TxnAssembler {
    router: Router,
    table: QualifiedName,
    outbox_oid: u32,
    relations: HashMap<u32, CachedRelation>,
    open: Option<OpenTxn>,
    next_seq: TxnSeq,
}

impl TxnAssembler {
    pub fn new(router: Router, table: QualifiedName, outbox_oid: u32, first_seq: TxnSeq) -> Self {
        TxnAssembler {
            router,
            table,
            outbox_oid,
            relations: HashMap::new(),
            open: None,
            next_seq: first_seq,
        }
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
                if !relation.is_outbox {
                    return Err(AssemblyError::ForeignRelation {
                        table: relation.display_name.clone(),
                        relation_id,
                        outbox: self.table.to_string(),
                    });
                }
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
                let event = self
                    .router
                    .route(&relation.columns, &new_tuple, context)
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
            PgOutputMessage::Origin { .. }
            | PgOutputMessage::Type { .. }
            | PgOutputMessage::Truncate { .. }
            | PgOutputMessage::Message { .. } => Ok(Step::Nothing),
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

    fn cache_relation(&mut self, body: RelationBody) -> Result<(), AssemblyError> {
        let named_outbox = body.namespace == self.table.schema && body.name == self.table.name;
        if body.relation_id == self.outbox_oid && !named_outbox {
            return Err(AssemblyError::OutboxRenamed {
                relation_id: body.relation_id,
                from: self.table.to_string(),
                to: format!("{}.{}", body.namespace, body.name),
            });
        }
        // The outbox's name under another relation id: rows of a table the application
        // wrote to as the outbox, published at the time (a stream replayed past a
        // drop-and-recreate decodes the old table by the name it had then). They are
        // events. Whether the publication still covers the outbox as it did is the
        // outbox watch's question (crate::relay::watch), which also bounds every
        // acknowledgement.
        let is_outbox = body.relation_id == self.outbox_oid || named_outbox;
        let cached = CachedRelation {
            is_outbox,
            display_name: format!("{}.{}", body.namespace, body.name),
            columns: self.router.resolve(&body),
            column_names: if is_outbox {
                body.columns.iter().map(|c| c.name.clone()).collect()
            } else {
                Vec::new()
            },
        };
        self.relations.insert(body.relation_id, cached);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::pgoutput::{ColumnValue, PgTimestamp, RelationColumn, TupleData};
    use crate::relay::router::config::OutboxConfig;

    fn assembler() -> TxnAssembler {
        TxnAssembler::new(
            Router::try_new(&OutboxConfig::default()).expect("default settings are valid"),
            QualifiedName::parse("public.outbox").unwrap(),
            1,
            0,
        )
    }

    fn relation(id: u32, name: &str, columns: &[&str]) -> PgOutputMessage {
        PgOutputMessage::Relation(RelationBody {
            xid: None,
            relation_id: id,
            namespace: "public".into(),
            name: name.into(),
            replica_identity: b'd',
            columns: columns
                .iter()
                .map(|c| RelationColumn {
                    is_key: false,
                    name: (*c).into(),
                    type_oid: 25,
                    type_modifier: -1,
                })
                .collect(),
        })
    }

    fn insert(relation_id: u32, values: &[&str]) -> PgOutputMessage {
        PgOutputMessage::Insert {
            xid: None,
            relation_id,
            new_tuple: TupleData {
                columns: values
                    .iter()
                    .map(|v| ColumnValue::Text(bytes::Bytes::copy_from_slice(v.as_bytes())))
                    .collect(),
            },
        }
    }

    fn begin() -> PgOutputMessage {
        PgOutputMessage::Begin {
            final_lsn: Lsn(90),
            commit_ts: PgTimestamp(0),
            xid: 7,
        }
    }

    fn commit(end: u64) -> PgOutputMessage {
        PgOutputMessage::Commit {
            flags: 0,
            commit_lsn: Lsn(end - 8),
            end_lsn: Lsn(end),
            commit_ts: PgTimestamp(0),
        }
    }

    #[test]
    fn assembles_a_transaction_and_routes_only_the_outbox() {
        let mut a = assembler();
        let cols = ["id", "aggregatetype", "aggregateid", "type", "payload"];
        assert!(matches!(
            a.apply(begin(), Lsn(0)).unwrap(),
            Step::Begin { seq: 0, .. }
        ));
        assert!(matches!(
            a.apply(relation(1, "outbox", &cols), Lsn(0)).unwrap(),
            Step::Nothing
        ));
        assert!(matches!(
            a.apply(relation(2, "orders", &["id"]), Lsn(0)).unwrap(),
            Step::Nothing
        ));
        match a
            .apply(insert(1, &["e1", "Order", "o1", "T", "{}"]), Lsn(80))
            .unwrap()
        {
            Step::Event {
                seq: 0,
                event: Ok(event),
            } => {
                assert_eq!(event.topic, "outbox.event.Order");
                assert_eq!(event.lsn, Lsn(80));
            }
            other => panic!("expected an event, got {other:?}"),
        }
        assert!(matches!(
            a.apply(commit(100), Lsn(100)).unwrap(),
            Step::Commit {
                seq: 0,
                end_lsn: Lsn(100)
            }
        ));
        assert!(matches!(
            a.apply(begin(), Lsn(0)).unwrap(),
            Step::Begin { seq: 1, .. }
        ));
    }

    #[test]
    fn a_new_relation_message_re_resolves_columns() {
        let mut a = assembler();
        a.apply(
            relation(
                1,
                "outbox",
                &["id", "aggregatetype", "aggregateid", "payload"],
            ),
            Lsn(0),
        )
        .unwrap();
        a.apply(begin(), Lsn(0)).unwrap();
        // After ALTER TABLE the column order changes; the next Relation message says so.
        a.apply(
            relation(
                1,
                "outbox",
                &["payload", "x", "aggregatetype", "id", "aggregateid"],
            ),
            Lsn(0),
        )
        .unwrap();
        match a
            .apply(insert(1, &["{}", "1", "User", "e9", "u"]), Lsn(5))
            .unwrap()
        {
            Step::Event {
                event: Ok(event), ..
            } => {
                assert_eq!(event.topic, "outbox.event.User");
                assert_eq!(event.key.as_deref(), Some("e9"));
            }
            other => panic!("expected an event, got {other:?}"),
        }
    }

    #[test]
    fn unroutable_rows_are_reported_with_their_position() {
        let mut a = assembler();
        a.apply(relation(1, "outbox", &["id", "payload"]), Lsn(0))
            .unwrap();
        a.apply(begin(), Lsn(0)).unwrap();
        match a.apply(insert(1, &["e1", "{}"]), Lsn(0)).unwrap() {
            Step::Event {
                event: Err(err), ..
            } => {
                assert_eq!(err.lsn, Lsn(90), "falls back to the commit position");
                assert!(err.to_string().contains("aggregatetype"), "{err}");
                assert!(err.to_string().contains("public.outbox"), "{err}");
                assert_eq!(
                    String::from_utf8(err.row_json.clone()).unwrap(),
                    r#"{"id":"e1","payload":"{}"}"#,
                    "the raw row, for the dead-letter topic"
                );
                let debug = format!("{err:?}");
                assert!(
                    debug.contains("<26 bytes>") && !debug.contains("e1"),
                    "no row values in Debug: {debug}"
                );
            }
            other => panic!("expected a routing error, got {other:?}"),
        }
    }

    #[test]
    fn a_renamed_outbox_table_is_a_definite_error() {
        let mut a = assembler();
        a.apply(relation(1, "outbox", &["id"]), Lsn(0)).unwrap();
        a.apply(relation(2, "orders", &["id"]), Lsn(0)).unwrap();
        a.apply(relation(2, "orders_v2", &["id"]), Lsn(0))
            .expect("other tables may be renamed");
        let err = a
            .apply(relation(1, "outbox_old", &["id"]), Lsn(0))
            .unwrap_err();
        assert!(matches!(
            err,
            AssemblyError::OutboxRenamed { relation_id: 1, .. }
        ));
        let message = err.to_string();
        assert!(
            message.contains("public.outbox_old") && message.contains("[outbox] table"),
            "{message}"
        );
    }

    #[test]
    fn an_insert_into_another_relation_stops_without_an_event() {
        let mut a = assembler();
        a.apply(relation(1, "outbox", &["id"]), Lsn(0)).unwrap();
        // A partition published under its own name (publish_via_partition_root off).
        a.apply(relation(5, "outbox_2026_12", &["id"]), Lsn(0))
            .expect("a Relation message alone is fine");
        a.apply(begin(), Lsn(0)).unwrap();
        let err = a.apply(insert(5, &["e1"]), Lsn(10)).unwrap_err();
        assert!(matches!(
            err,
            AssemblyError::ForeignRelation { relation_id: 5, .. }
        ));
        let message = err.to_string();
        assert!(
            message.contains("public.outbox_2026_12")
                && message.contains("publish_via_partition_root = true")
                && message.contains("DROP TABLE"),
            "{message}"
        );
    }

    #[test]
    fn the_outbox_name_under_another_relation_id_is_still_the_outbox() {
        let mut a = assembler();
        let cols = ["id", "aggregatetype", "aggregateid", "type", "payload"];
        a.apply(relation(9, "outbox", &cols), Lsn(0)).unwrap();
        a.apply(begin(), Lsn(0)).unwrap();
        match a
            .apply(insert(9, &["e1", "Order", "o1", "T", "{}"]), Lsn(10))
            .unwrap()
        {
            Step::Event {
                event: Ok(event), ..
            } => assert_eq!(event.topic, "outbox.event.Order"),
            other => panic!("expected an event, got {other:?}"),
        }
    }

    #[test]
    fn protocol_violations_are_errors() {
        let mut a = assembler();
        assert!(matches!(
            a.apply(commit(10), Lsn(0)),
            Err(AssemblyError::OutsideTransaction { message: "Commit" })
        ));
        a.apply(begin(), Lsn(0)).unwrap();
        assert!(matches!(
            a.apply(begin(), Lsn(0)),
            Err(AssemblyError::NestedBegin { .. })
        ));
        assert!(matches!(
            a.apply(insert(42, &["x"]), Lsn(0)),
            Err(AssemblyError::UnknownRelation { relation_id: 42 })
        ));
        assert!(matches!(
            a.apply(PgOutputMessage::StreamStop, Lsn(0)),
            Err(AssemblyError::Unexpected { .. })
        ));
    }
}
