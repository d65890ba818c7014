//! The router: pure, `(relation, row) → OutboxEvent`, shaped as Debezium's Outbox Event
//! Router shapes records so consumers can switch relays without changes.
//!
//! Columns are resolved by name from each Relation message ([`Router::resolve`]), so a
//! schema change mid-stream (which PostgreSQL announces with a new Relation message)
//! keeps routing right.

use crate::config::OutboxConfig;
use crate::pg::pgoutput::{ColumnValue, RelationBody, TupleData};
use crate::pg::Lsn;

/// PostgreSQL type oids that decide how a payload is written.
const JSON_OID: u32 = 114;
const JSONB_OID: u32 = 3802;
const BYTEA_OID: u32 = 17;

/// What the payload bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadFormat {
    /// `json` / `jsonb`: the bytes are a JSON document.
    Json,
    /// Any other type, in PostgreSQL's text form (UTF-8).
    Text,
    /// `bytea`, decoded to raw bytes.
    Binary,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: Option<String>,
}

/// One routed event, ready for a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub topic: String,
    pub key: Option<String>,
    pub headers: Vec<Header>,
    /// The payload as stored; `None` for SQL NULL.
    pub payload: Option<Vec<u8>>,
    pub payload_format: PayloadFormat,
    /// WAL position of the insert.
    pub lsn: Lsn,
    /// Record timestamp: the transaction's commit time, in Unix milliseconds.
    pub timestamp_ms: i64,
}

/// Why a row could not become an event. Never skipped silently: the relay stops (or,
/// with a dead-letter topic, parks the row there).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("the outbox table has no column {column:?} (configured as outbox.{setting}); add the column or change the setting")]
    MissingColumn {
        column: String,
        setting: &'static str,
    },
    #[error("column {column:?} (outbox.{setting}) is NULL; it must have a value")]
    NullValue {
        column: String,
        setting: &'static str,
    },
    #[error("column {column:?} holds a value that is not valid UTF-8 text")]
    NotUtf8 { column: String },
    #[error("column {column:?} holds a bytea value that is not in PostgreSQL's hex format")]
    BadBytea { column: String },
    #[error("the row has {got} columns but the relation declares {expected}")]
    ColumnCount { expected: usize, got: usize },
    #[error("column {column:?} was sent as an unchanged TOAST value, which an insert cannot have")]
    UnchangedToast { column: String },
}

/// Column positions of one relation, resolved from its Relation message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedColumns {
    width: usize,
    id: Result<usize, RouteError>,
    key: Result<usize, RouteError>,
    route_by: Result<usize, RouteError>,
    payload: Result<(usize, PayloadFormat), RouteError>,
}

/// Per-event context the row does not carry.
#[derive(Debug, Clone, Copy)]
pub struct EventContext {
    pub lsn: Lsn,
    pub commit_ts_ms: i64,
}

/// The routing rules taken from `[outbox]`.
#[derive(Debug, Clone)]
pub struct Router {
    id_column: String,
    key_column: String,
    route_by_column: String,
    payload_column: String,
    topic_prefix: String,
    topic_suffix: Option<String>,
}

const ROUTED_BY_VALUE: &str = "${routedByValue}";

impl Router {
    pub fn new(config: &OutboxConfig) -> Self {
        let (topic_prefix, topic_suffix) = match config.topic.split_once(ROUTED_BY_VALUE) {
            Some((prefix, suffix)) => (prefix.to_owned(), Some(suffix.to_owned())),
            None => (config.topic.clone(), None),
        };
        Router {
            id_column: config.id_column.clone(),
            key_column: config.key_column.clone(),
            route_by_column: config.route_by_column.clone(),
            payload_column: config.payload_column.clone(),
            topic_prefix,
            topic_suffix,
        }
    }

    /// Resolve the configured column names against a relation's columns.
    pub fn resolve(&self, relation: &RelationBody) -> ResolvedColumns {
        let find = |column: &str, setting: &'static str| {
            relation
                .columns
                .iter()
                .position(|c| c.name == column)
                .ok_or_else(|| RouteError::MissingColumn {
                    column: column.to_owned(),
                    setting,
                })
        };
        let payload = find(&self.payload_column, "payload_column").map(|index| {
            let format = match relation.columns[index].type_oid {
                JSON_OID | JSONB_OID => PayloadFormat::Json,
                BYTEA_OID => PayloadFormat::Binary,
                _ => PayloadFormat::Text,
            };
            (index, format)
        });
        ResolvedColumns {
            width: relation.columns.len(),
            id: find(&self.id_column, "id_column"),
            key: find(&self.key_column, "key_column"),
            route_by: find(&self.route_by_column, "route_by_column"),
            payload,
        }
    }

    /// Route one inserted row.
    pub fn route(
        &self,
        columns: &ResolvedColumns,
        row: &TupleData,
        context: EventContext,
    ) -> Result<OutboxEvent, RouteError> {
        if row.columns.len() != columns.width {
            return Err(RouteError::ColumnCount {
                expected: columns.width,
                got: row.columns.len(),
            });
        }
        let id_index = columns.id.clone()?;
        let id = text(row, id_index, &self.id_column)?.ok_or_else(|| RouteError::NullValue {
            column: self.id_column.clone(),
            setting: "id_column",
        })?;
        let route_index = columns.route_by.clone()?;
        let routed_by = text(row, route_index, &self.route_by_column)?.ok_or_else(|| {
            RouteError::NullValue {
                column: self.route_by_column.clone(),
                setting: "route_by_column",
            }
        })?;
        let key = text(row, columns.key.clone()?, &self.key_column)?;
        let (payload_index, payload_format) = columns.payload.clone()?;
        let payload = match raw(row, payload_index, &self.payload_column)? {
            None => None,
            Some(bytes) if payload_format == PayloadFormat::Binary => {
                Some(decode_bytea(bytes).ok_or_else(|| RouteError::BadBytea {
                    column: self.payload_column.clone(),
                })?)
            }
            Some(bytes) => Some(bytes.to_vec()),
        };
        let topic = match &self.topic_suffix {
            Some(suffix) => {
                let mut topic =
                    String::with_capacity(self.topic_prefix.len() + routed_by.len() + suffix.len());
                topic.push_str(&self.topic_prefix);
                topic.push_str(&routed_by);
                topic.push_str(suffix);
                topic
            }
            None => self.topic_prefix.clone(),
        };
        Ok(OutboxEvent {
            topic,
            key,
            headers: vec![Header {
                name: "id".into(),
                value: Some(id),
            }],
            payload,
            payload_format,
            lsn: context.lsn,
            timestamp_ms: context.commit_ts_ms,
        })
    }
}

fn raw<'a>(row: &'a TupleData, index: usize, column: &str) -> Result<Option<&'a [u8]>, RouteError> {
    match row.columns.get(index) {
        Some(ColumnValue::Text(bytes)) | Some(ColumnValue::Binary(bytes)) => Ok(Some(bytes)),
        Some(ColumnValue::Null) | None => Ok(None),
        Some(ColumnValue::UnchangedToast) => Err(RouteError::UnchangedToast {
            column: column.to_owned(),
        }),
    }
}

fn text(row: &TupleData, index: usize, column: &str) -> Result<Option<String>, RouteError> {
    raw(row, index, column)?
        .map(|bytes| {
            String::from_utf8(bytes.to_vec()).map_err(|_| RouteError::NotUtf8 {
                column: column.to_owned(),
            })
        })
        .transpose()
}

/// PostgreSQL's bytea hex output: `\x` followed by two hex digits per byte.
fn decode_bytea(text: &[u8]) -> Option<Vec<u8>> {
    let hex = text.strip_prefix(b"\\x")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    hex.chunks_exact(2)
        .map(|pair| {
            let digits = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(digits, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::pgoutput::RelationColumn;

    fn relation(columns: &[(&str, u32)]) -> RelationBody {
        RelationBody {
            xid: None,
            relation_id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: columns
                .iter()
                .map(|(name, oid)| RelationColumn {
                    is_key: false,
                    name: (*name).into(),
                    type_oid: *oid,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    fn debezium_relation() -> RelationBody {
        relation(&[
            ("id", 2950),
            ("aggregatetype", 25),
            ("aggregateid", 25),
            ("type", 25),
            ("payload", JSONB_OID),
        ])
    }

    fn row(values: &[Option<&str>]) -> TupleData {
        TupleData {
            columns: values
                .iter()
                .map(|v| match v {
                    Some(text) => ColumnValue::Text(text.as_bytes().to_vec()),
                    None => ColumnValue::Null,
                })
                .collect(),
        }
    }

    const CONTEXT: EventContext = EventContext {
        lsn: Lsn(0x10),
        commit_ts_ms: 1_700_000_000_000,
    };

    #[test]
    fn debezium_defaults() {
        let router = Router::new(&OutboxConfig::default());
        let columns = router.resolve(&debezium_relation());
        let event = router
            .route(
                &columns,
                &row(&[
                    Some("e-1"),
                    Some("Order"),
                    Some("o-9"),
                    Some("Created"),
                    Some("{\"n\": 1}"),
                ]),
                CONTEXT,
            )
            .unwrap();
        assert_eq!(event.topic, "outbox.event.Order");
        assert_eq!(event.key.as_deref(), Some("e-1"));
        assert_eq!(
            event.headers,
            vec![Header {
                name: "id".into(),
                value: Some("e-1".into())
            }]
        );
        assert_eq!(event.payload.as_deref(), Some(&b"{\"n\": 1}"[..]));
        assert_eq!(event.payload_format, PayloadFormat::Json);
        assert_eq!(
            (event.lsn, event.timestamp_ms),
            (Lsn(0x10), 1_700_000_000_000)
        );
    }

    #[test]
    fn key_column_and_topic_template_are_configurable() {
        let config = OutboxConfig {
            key_column: "aggregateid".into(),
            topic: "events-${routedByValue}-v1".into(),
            ..OutboxConfig::default()
        };
        let router = Router::new(&config);
        let columns = router.resolve(&debezium_relation());
        let event = router
            .route(
                &columns,
                &row(&[Some("e"), Some("user"), Some("u-1"), None, None]),
                CONTEXT,
            )
            .unwrap();
        assert_eq!(event.topic, "events-user-v1");
        assert_eq!(event.key.as_deref(), Some("u-1"));
        assert_eq!(event.payload, None);
    }

    #[test]
    fn columns_are_found_by_name_in_any_order() {
        let router = Router::new(&OutboxConfig::default());
        let reordered = relation(&[
            ("payload", 25),
            ("extra", 23),
            ("aggregatetype", 25),
            ("id", 25),
            ("aggregateid", 25),
        ]);
        let columns = router.resolve(&reordered);
        let event = router
            .route(
                &columns,
                &row(&[Some("hi"), Some("1"), Some("A"), Some("x"), Some("y")]),
                CONTEXT,
            )
            .unwrap();
        assert_eq!(
            (event.topic.as_str(), event.key.as_deref()),
            ("outbox.event.A", Some("x"))
        );
        assert_eq!(event.payload_format, PayloadFormat::Text);
    }

    #[test]
    fn invalid_rows_are_errors_not_events() {
        let router = Router::new(&OutboxConfig::default());
        let columns = router.resolve(&debezium_relation());
        let null_id = router.route(
            &columns,
            &row(&[None, Some("A"), Some("x"), None, None]),
            CONTEXT,
        );
        assert!(matches!(
            null_id,
            Err(RouteError::NullValue {
                setting: "id_column",
                ..
            })
        ));
        let null_route = router.route(
            &columns,
            &row(&[Some("e"), None, Some("x"), None, None]),
            CONTEXT,
        );
        assert!(matches!(
            null_route,
            Err(RouteError::NullValue {
                setting: "route_by_column",
                ..
            })
        ));
        let short = router.route(&columns, &row(&[Some("e")]), CONTEXT);
        assert!(matches!(
            short,
            Err(RouteError::ColumnCount {
                expected: 5,
                got: 1
            })
        ));
        let no_payload = router.resolve(&relation(&[("id", 25), ("aggregatetype", 25)]));
        let err = router
            .route(&no_payload, &row(&[Some("e"), Some("A")]), CONTEXT)
            .unwrap_err();
        assert!(err.to_string().contains("payload_column"), "{err}");
    }

    #[test]
    fn bytea_payload_is_decoded_to_raw_bytes() {
        let router = Router::new(&OutboxConfig::default());
        let columns = router.resolve(&relation(&[
            ("id", 25),
            ("aggregatetype", 25),
            ("payload", BYTEA_OID),
        ]));
        let event = router
            .route(
                &columns,
                &row(&[Some("e"), Some("A"), Some("\\x00ff41")]),
                CONTEXT,
            )
            .unwrap();
        assert_eq!(event.payload.as_deref(), Some(&[0u8, 0xff, 0x41][..]));
        let bad = router.route(
            &columns,
            &row(&[Some("e"), Some("A"), Some("\\x0")]),
            CONTEXT,
        );
        assert!(matches!(bad, Err(RouteError::BadBytea { .. })));
    }
}
