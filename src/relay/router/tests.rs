//! Unit tests of the router: Debezium defaults, placements, topic regex, tombstones,
//! timestamps and every row error.
//!
//! This file holds what the tests share (a router from settings, relations and rows,
//! the wide outbox row with a column of each kind); the tests are in `tests/`, one file
//! per part of the router: `defaults.rs` (the default shape and finding columns),
//! `placements.rs` (`outbox.additional`), `topics.rs` (the topic, tombstones, the
//! timestamp) and `errors.rs` (what is refused, and why).

mod defaults;
mod errors;
mod placements;
mod topics;

use super::*;
use crate::pg::pgoutput::RelationColumn;

fn router(config: &OutboxConfig) -> Router {
    Router::try_new(config).expect("valid settings")
}

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
                Some(text) => ColumnValue::Text(bytes::Bytes::copy_from_slice(text.as_bytes())),
                None => ColumnValue::Null,
            })
            .collect(),
    }
}

const CONTEXT: EventContext = EventContext {
    lsn: Lsn(0x10),
    commit_ts_ms: 1_700_000_000_000,
};

// ---- A wide row: placements, timestamps, the type column ----

const TEXT: u32 = 25;
const INT4: u32 = 23;
const BOOL: u32 = 16;
const TIMESTAMPTZ: u32 = 1184;

fn with(additional: &[&str]) -> OutboxConfig {
    OutboxConfig {
        additional: additional.iter().map(|s| (*s).to_owned()).collect(),
        ..OutboxConfig::default()
    }
}

/// id, aggregatetype, aggregateid, type, payload (jsonb), shard (int4), flag (bool),
/// meta (jsonb), blob (bytea), created (timestamptz)
fn wide_relation() -> RelationBody {
    relation(&[
        ("id", TEXT),
        ("aggregatetype", TEXT),
        ("aggregateid", TEXT),
        ("type", TEXT),
        ("payload", JSONB_OID),
        ("shard", INT4),
        ("flag", BOOL),
        ("meta", JSONB_OID),
        ("blob", BYTEA_OID),
        ("created", TIMESTAMPTZ),
    ])
}

fn wide_row(payload: Option<&str>) -> TupleData {
    row(&[
        Some("e-1"),
        Some("Order"),
        Some("o-9"),
        Some("OrderCreated"),
        payload,
        Some("3"),
        Some("t"),
        Some("{\"v\": 2}"),
        Some("\\x666f6f"),
        Some("2026-11-30 11:46:24.123456+05:30"),
    ])
}

fn route_wide(config: &OutboxConfig, row: &TupleData) -> Result<OutboxEvent, RouteError> {
    let router = router(config);
    let columns = router.resolve(&wide_relation());
    router.route(&columns, row, CONTEXT)
}

fn value_text(event: &OutboxEvent) -> Option<String> {
    event
        .value()
        .map(|bytes| String::from_utf8(bytes.into_owned()).unwrap())
}
