//! The router: pure, `(relation, row) → OutboxEvent`, shaped as Debezium's Outbox Event
//! Router shapes records so consumers can switch relays without changes.
//!
//! ```text
//! Relation ──▶ Router::resolve ──▶ ResolvedColumns   (column positions by name)
//! Insert row ─▶ Router::route ───▶ OutboxEvent { topic, partition, key, headers,
//!                                               value (payload | envelope | tombstone),
//!                                               timestamp }  |  RouteError
//! ```
//!
//! Columns are resolved by name from each Relation message ([`Router::resolve`]), so a
//! schema change mid-stream (which PostgreSQL announces with a new Relation message)
//! keeps routing right. A configured column the table lacks is an error of each row that
//! needs it, never of the relation: the row goes to the dead-letter topic with the reason.
//!
//! Debezium semantics kept here:
//!
//! - **Topic**: `outbox.topic_regex` must match the *whole* route-by value (Java's
//!   `Matcher.matches()`); its groups fill the `outbox.topic` template (`${name}`, `$n`,
//!   `\` escapes). A value the regex does not match is not rerouted: the topic is the
//!   route-by value itself.
//! - **Headers**: `id` (the event id) first, then each `header` placement in
//!   configuration order, named by its alias (the column name when no alias is given).
//! - **Value**: the payload as stored (json/jsonb as JSON text, text as UTF-8, bytea as
//!   raw bytes). With at least one `envelope` placement the value becomes a JSON object
//!   `{"payload": …, "<alias>": …}` (see [`OutboxEvent::value`]).
//! - **Partition**: the one `partition` placement's column, a non-negative 32-bit
//!   integer; else the producer's partitioner decides.
//! - **Tombstone**: with `outbox.tombstone_on_empty_payload`, a NULL, empty or
//!   whitespace-only payload (an empty bytea) gives a null record value. Without it a
//!   NULL payload still gives a null value unless an envelope wraps it, and an empty
//!   payload is sent as it is.
//! - **Timestamp**: `outbox.timestamp_column` (a timestamptz, or a timestamp read as
//!   UTC) when set and not NULL, else the transaction's commit time.

pub mod config;
mod pgtext;
pub(crate) mod placement;

use crate::pg::pgoutput::{ColumnValue, RelationBody, TupleData};
use crate::pg::Lsn;
use config::OutboxConfig;

pub use crate::event::{EnvelopeField, Header, OutboxEvent, PayloadFormat};
pub use pgtext::{parse_pg_timestamp_ms, row_as_json};
pub use placement::{AdditionalField, Placement};

use pgtext::{ValueKind, BYTEA_OID, JSONB_OID, JSON_OID};
use placement::TopicRule;

/// Why a row could not become an event. Never skipped silently: the relay stops (or,
/// with a dead-letter topic, parks the row there).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("the outbox table has no column {column:?} (configured as outbox.{setting}); add the column or change the setting")]
    MissingColumn {
        column: String,
        setting: &'static str,
    },
    #[error("the outbox table has no column {column:?} (configured as outbox.additional[{index}] = {spec:?}); add the column or change the setting")]
    MissingAdditionalColumn {
        column: String,
        index: usize,
        spec: String,
    },
    #[error("column {column:?} (outbox.{setting}) is NULL; it must have a value")]
    NullValue {
        column: String,
        setting: &'static str,
    },
    #[error("column {column:?} gives the record partition (outbox.additional[{index}]) but is NULL; it must hold a partition number")]
    NullPartition { column: String, index: usize },
    #[error("column {column:?} gives the record partition (outbox.additional[{index}]) but holds {value:?}, which is not a 32-bit integer")]
    PartitionNotInteger {
        column: String,
        index: usize,
        value: String,
    },
    #[error("column {column:?} gives the record partition (outbox.additional[{index}]) but holds {value}; a partition number is 0 or more")]
    NegativePartition {
        column: String,
        index: usize,
        value: i32,
    },
    #[error("column {column:?} (outbox.timestamp_column) holds {value:?}, which is not a usable timestamp: {reason}")]
    BadTimestamp {
        column: String,
        value: String,
        reason: &'static str,
    },
    #[error("column {column:?} holds a value that is not valid UTF-8 text")]
    NotUtf8 { column: String },
    #[error("column {column:?} holds a bytea value that is not in PostgreSQL's hex format (bytea_output = hex)")]
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
    /// `None` when `outbox.type_column` is `""` (the table has no type column).
    event_type: Option<Result<usize, RouteError>>,
    payload: Result<(usize, PayloadFormat), RouteError>,
    /// `None` when no timestamp column is configured.
    timestamp: Option<Result<usize, RouteError>>,
    /// One per [`Router`] additional field, in the same order.
    additional: Vec<Result<(usize, ValueKind), RouteError>>,
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
    type_column: String,
    payload_column: String,
    timestamp_column: Option<String>,
    topic: TopicRule,
    additional: Vec<AdditionalField>,
    has_envelope: bool,
    tombstone_on_empty_payload: bool,
}

/// The configured column names of a [`Router`] (`outbox.*_column`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterColumns<'a> {
    pub id: &'a str,
    pub key: &'a str,
    pub route_by: &'a str,
    /// `None` when `outbox.type_column` is `""`.
    pub event_type: Option<&'a str>,
    pub payload: &'a str,
    pub timestamp: Option<&'a str>,
}

/// Longest row value quoted in an error message.
const QUOTED_VALUE_CHARS: usize = 64;

impl Router {
    /// The column of the `partition` placement, if there is one.
    pub fn partition_column(&self) -> Option<&str> {
        self.additional
            .iter()
            .find(|field| field.placement == Placement::Partition)
            .map(|field| field.column.as_str())
    }

    /// Build the router, or return every problem of the `[outbox]` routing settings,
    /// each starting with its key path (`outbox.additional[1]: …`).
    pub fn try_new(config: &OutboxConfig) -> Result<Self, Vec<String>> {
        let mut problems = Vec::new();
        let topic = TopicRule::new(&config.topic_regex, &config.topic, &mut problems);
        let additional = placement::parse_additional(&config.additional, &mut problems);
        match topic {
            Some(topic) if problems.is_empty() => Ok(Router {
                id_column: config.id_column.clone(),
                key_column: config.key_column.clone(),
                route_by_column: config.route_by_column.clone(),
                type_column: config.type_column.clone(),
                payload_column: config.payload_column.clone(),
                timestamp_column: config.timestamp_column.clone(),
                topic,
                has_envelope: additional
                    .iter()
                    .any(|f| f.placement == Placement::Envelope),
                additional,
                tombstone_on_empty_payload: config.tombstone_on_empty_payload,
            }),
            _ => Err(problems),
        }
    }

    pub fn key_column(&self) -> &str {
        &self.key_column
    }

    /// The topic of every route-by value the regex matches, when the template uses
    /// none of its groups (a constant such as `"events"`).
    pub fn constant_topic(&self) -> Option<String> {
        self.topic.constant()
    }

    /// The template's text before its first group (all of it for a constant topic):
    /// every topic the regex routes to starts with it.
    pub fn topic_prefix(&self) -> String {
        self.topic.literal_prefix()
    }

    /// The column names the router reads, each with its `[outbox]` key, for checks of
    /// the table against the settings (`outbox-relay check`); the additional columns
    /// are in [`Router::additional`].
    pub fn columns(&self) -> RouterColumns<'_> {
        RouterColumns {
            id: &self.id_column,
            key: &self.key_column,
            route_by: &self.route_by_column,
            event_type: Some(self.type_column.as_str()).filter(|c| !c.is_empty()),
            payload: &self.payload_column,
            timestamp: self.timestamp_column.as_deref(),
        }
    }

    /// The parsed `outbox.additional` entries.
    pub fn additional(&self) -> &[AdditionalField] {
        &self.additional
    }

    /// Resolve the configured column names against a relation's columns.
    pub fn resolve(&self, relation: &RelationBody) -> ResolvedColumns {
        let position = |column: &str| relation.columns.iter().position(|c| c.name == column);
        let find = |column: &str, setting: &'static str| {
            position(column).ok_or_else(|| RouteError::MissingColumn {
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
        let additional = self
            .additional
            .iter()
            .map(|field| {
                let index =
                    position(&field.column).ok_or_else(|| RouteError::MissingAdditionalColumn {
                        column: field.column.clone(),
                        index: field.index,
                        spec: field.spec.clone(),
                    })?;
                Ok((index, ValueKind::of_type(relation.columns[index].type_oid)))
            })
            .collect();
        ResolvedColumns {
            width: relation.columns.len(),
            id: find(&self.id_column, "id_column"),
            key: find(&self.key_column, "key_column"),
            route_by: find(&self.route_by_column, "route_by_column"),
            event_type: (!self.type_column.is_empty())
                .then(|| find(&self.type_column, "type_column")),
            payload,
            timestamp: self
                .timestamp_column
                .as_deref()
                .map(|column| find(column, "timestamp_column")),
            additional,
        }
    }

    /// The event type (`outbox.type_column`), for logs and dead-letter records. Debezium
    /// does not put it in the record by itself: place it with `outbox.additional`
    /// (`"type:header:eventType"`). A missing type column is an error only when asked.
    pub fn event_type(
        &self,
        columns: &ResolvedColumns,
        row: &TupleData,
    ) -> Result<Option<String>, RouteError> {
        match &columns.event_type {
            Some(column) => text(row, column.clone()?, &self.type_column),
            None => Ok(None),
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
        let topic = self.topic.topic(&routed_by);
        let key = text(row, columns.key.clone()?, &self.key_column)?;
        let (payload_index, payload_format) = columns.payload.clone()?;
        let payload = match raw(row, payload_index, &self.payload_column)? {
            None => None,
            Some(bytes) if payload_format == PayloadFormat::Binary => Some(
                pgtext::decode_bytea(bytes)
                    .ok_or_else(|| RouteError::BadBytea {
                        column: self.payload_column.clone(),
                    })?
                    .into(),
            ),
            // A slice of the received message: no copy.
            Some(bytes) => Some(bytes.clone()),
        };
        let timestamp_ms = match (&columns.timestamp, &self.timestamp_column) {
            (Some(resolved), Some(column)) => self
                .timestamp(row, resolved.clone()?, column)?
                .unwrap_or(context.commit_ts_ms),
            _ => context.commit_ts_ms,
        };

        let mut headers = Vec::with_capacity(1 + self.additional.len());
        headers.push(Header {
            name: "id".into(),
            value: Some(id),
        });
        let mut envelope = Vec::new();
        let mut partition = None;
        for (field, resolved) in self.additional.iter().zip(&columns.additional) {
            let (index, kind) = resolved.clone()?;
            let value = text(row, index, &field.column)?;
            match field.placement {
                Placement::Header => headers.push(Header {
                    name: field.alias.clone(),
                    value,
                }),
                Placement::Envelope => {
                    let mut json = Vec::new();
                    pgtext::push_json_value(&mut json, kind, value.as_deref()).map_err(|()| {
                        RouteError::BadBytea {
                            column: field.column.clone(),
                        }
                    })?;
                    envelope.push(EnvelopeField {
                        name: field.alias.clone(),
                        // Built from str pieces and ASCII: always UTF-8.
                        json: String::from_utf8(json)
                            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
                    });
                }
                Placement::Partition => partition = Some(partition_number(field, value)?),
            }
        }

        let empty = match (&payload, payload_format) {
            (None, _) => true,
            (Some(bytes), PayloadFormat::Binary) => bytes.is_empty(),
            // Java's String.trim(): every character up to U+0020 is whitespace.
            (Some(bytes), _) => bytes.iter().all(|b| *b <= b' '),
        };
        let tombstone =
            (self.tombstone_on_empty_payload && empty) || (payload.is_none() && !self.has_envelope);
        Ok(OutboxEvent {
            topic,
            partition,
            key,
            headers,
            payload,
            payload_format,
            envelope,
            tombstone,
            lsn: context.lsn,
            timestamp_ms,
            outbox: 0,
        })
    }

    /// The timestamp column's value in Unix ms; `None` for NULL.
    fn timestamp(
        &self,
        row: &TupleData,
        index: usize,
        column: &str,
    ) -> Result<Option<i64>, RouteError> {
        let Some(value) = text(row, index, column)? else {
            return Ok(None);
        };
        parse_pg_timestamp_ms(&value)
            .map(Some)
            .map_err(|reason| RouteError::BadTimestamp {
                column: column.to_owned(),
                value: pgtext::shorten(&value, QUOTED_VALUE_CHARS),
                reason,
            })
    }
}

fn partition_number(field: &AdditionalField, value: Option<String>) -> Result<i32, RouteError> {
    let value = value.ok_or_else(|| RouteError::NullPartition {
        column: field.column.clone(),
        index: field.index,
    })?;
    match value.parse::<i32>() {
        Ok(number) if number >= 0 => Ok(number),
        Ok(number) => Err(RouteError::NegativePartition {
            column: field.column.clone(),
            index: field.index,
            value: number,
        }),
        Err(_) => Err(RouteError::PartitionNotInteger {
            column: field.column.clone(),
            index: field.index,
            value: pgtext::shorten(&value, QUOTED_VALUE_CHARS),
        }),
    }
}

fn raw<'a>(
    row: &'a TupleData,
    index: usize,
    column: &str,
) -> Result<Option<&'a bytes::Bytes>, RouteError> {
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

#[cfg(test)]
mod tests;
