//! The relay's record of its slot, kept in the database itself (a table next to the
//! outbox), so that it follows the data through a physical failover or a restore, where
//! a local file would not.
//!
//! ```text
//!  slot missing, no record (or never streamed)   first run: create the slot, record it
//!  slot missing, record says it streamed         the slot was lost: stop, say what is
//!                                                missing since when, and the ways out
//!  slot present                                  stream; note the acknowledged position
//!                                                (at most once a second while events
//!                                                are acknowledged), and skip what it
//!                                                covers if the slot rewound
//!                                                (crate::relay::record)
//! ```
//!
//! A new slot starts at the server's current position: creating one silently after the
//! old one was lost (dropped by an operator, removed by `max_slot_wal_keep_size`, absent
//! on a promoted standby) would skip every event committed in between.

use crate::pg::conn::{PgConnection, PgError};
use crate::pg::diagnose::SetupError;
use crate::pg::sql::{quote_literal, QualifiedName};
use crate::pg::Lsn;

/// The table's name when `[postgres] state_table` is not set: in the outbox's schema.
pub const DEFAULT_STATE_TABLE: &str = "outbox_relay_state";

/// What the record says about a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRecord {
    pub created_at: Option<String>,
    /// When a relay first started streaming from the slot: from then on, losing it
    /// loses events.
    pub first_streamed_at: Option<String>,
    pub acknowledged_lsn: Option<Lsn>,
    pub acknowledged_at: Option<String>,
    pub system_identifier: Option<String>,
}

impl SlotRecord {
    /// Whether the slot was streamed from, so that a missing slot means lost events.
    pub fn streamed(&self) -> bool {
        self.first_streamed_at.is_some()
    }
}

/// `CREATE TABLE IF NOT EXISTS` for the record (also printed as the fix when the relay's
/// role may not create it).
pub fn create_table_sql(table: &QualifiedName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
         slot_name text PRIMARY KEY, \
         system_identifier text, \
         created_at timestamptz, \
         first_streamed_at timestamptz, \
         acknowledged_lsn pg_lsn, \
         acknowledged_at timestamptz, \
         gap_accepted_at timestamptz, \
         gap_from_lsn pg_lsn, \
         gap_to_lsn pg_lsn)",
        table.quoted()
    )
}

/// Reads the record of `slot` (None: there is none).
pub fn read_sql(table: &QualifiedName, slot: &str) -> String {
    format!(
        "SELECT created_at::text AS created_at, first_streamed_at::text AS first_streamed_at, \
                acknowledged_lsn::text AS acknowledged_lsn, acknowledged_at::text AS acknowledged_at, \
                system_identifier \
           FROM {} WHERE slot_name = {}",
        table.quoted(),
        quote_literal(slot)
    )
}

/// A new slot: the record starts over (nothing streamed, nothing acknowledged yet).
pub fn created_sql(table: &QualifiedName, slot: &str, system_identifier: &str) -> String {
    format!(
        "INSERT INTO {} (slot_name, system_identifier, created_at) VALUES ({}, {}, now()) \
         ON CONFLICT (slot_name) DO UPDATE SET system_identifier = EXCLUDED.system_identifier, \
         created_at = now(), first_streamed_at = NULL, acknowledged_lsn = NULL, acknowledged_at = NULL",
        table.quoted(),
        quote_literal(slot),
        quote_literal(system_identifier)
    )
}

/// Streaming from the slot begins: sets `first_streamed_at` when it is not set yet. Also
/// creates the record of a slot made before the relay kept records. Run only when the
/// record does not say so already ([`read`] first): a row the `WHERE` leaves alone is
/// still locked.
pub fn streaming_sql(table: &QualifiedName, slot: &str, system_identifier: &str) -> String {
    format!(
        "INSERT INTO {} (slot_name, system_identifier, created_at, first_streamed_at) \
         VALUES ({}, {}, now(), now()) \
         ON CONFLICT (slot_name) DO UPDATE SET first_streamed_at = now() \
         WHERE {}.first_streamed_at IS NULL",
        table.quoted(),
        quote_literal(slot),
        quote_literal(system_identifier),
        table.quoted()
    )
}

/// The relay acknowledged up to `lsn`.
pub fn acknowledged_sql(table: &QualifiedName, slot: &str, lsn: Lsn) -> String {
    format!(
        "UPDATE {} SET acknowledged_lsn = {}::pg_lsn, acknowledged_at = now() WHERE slot_name = {}",
        table.quoted(),
        quote_literal(&lsn.to_string()),
        quote_literal(slot)
    )
}

/// An operator accepted the gap between a lost slot's last acknowledged position and a
/// new slot's start.
pub fn gap_sql(table: &QualifiedName, slot: &str, from: Option<Lsn>, to: Lsn) -> String {
    let from = from.map_or_else(
        || "NULL".to_owned(),
        |lsn| format!("{}::pg_lsn", quote_literal(&lsn.to_string())),
    );
    format!(
        "UPDATE {} SET gap_accepted_at = now(), gap_from_lsn = {from}, gap_to_lsn = {}::pg_lsn \
         WHERE slot_name = {}",
        table.quoted(),
        quote_literal(&to.to_string()),
        quote_literal(slot)
    )
}

/// Creates the table when missing. A role that may not gets the statement to run.
pub async fn ensure_table(
    conn: &mut PgConnection,
    table: &QualifiedName,
) -> Result<(), SetupError> {
    let exists = conn
        .simple_query(&format!(
            "SELECT pg_catalog.to_regclass({})::oid AS oid",
            quote_literal(&table.quoted())
        ))
        .await?;
    if exists.get(0, "oid").is_some() {
        return Ok(());
    }
    let create = create_table_sql(table);
    match conn.simple_query(&create).await {
        Ok(_) => {
            tracing::info!(%table, "created the relay's state table (its record of the slot)");
            Ok(())
        }
        Err(error) => Err(creation_failed(table, &create, error)),
    }
}

/// What a failed `CREATE TABLE` of the state table means. A missing privilege is the
/// operator's to fix; anything else (a connection lost, a server restarting) stays the
/// PostgreSQL error it is, transient or not by its kind: a relay must not stop for good
/// because PostgreSQL restarted while it prepared (a chaos run's relay once did).
fn creation_failed(table: &QualifiedName, create: &str, error: PgError) -> SetupError {
    match error {
        PgError::Db(db) if db.code == "42501" => SetupError::Definite(format!(
            "the relay keeps a record of its slot in {table} ({}) and may not create it ({}): run `{create}` and GRANT SELECT, INSERT, UPDATE ON {} TO the relay's role, or set [postgres] state_table to a table it may create",
            "so that a lost slot is never silently replaced",
            db.message,
            table.quoted()
        )),
        other => SetupError::Pg(other),
    }
}

/// Reads the record of `slot`.
pub async fn read(
    conn: &mut PgConnection,
    table: &QualifiedName,
    slot: &str,
) -> Result<Option<SlotRecord>, PgError> {
    let result = conn.simple_query(&read_sql(table, slot)).await?;
    if result.rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(SlotRecord {
        created_at: result.get(0, "created_at").map(str::to_owned),
        first_streamed_at: result.get(0, "first_streamed_at").map(str::to_owned),
        acknowledged_lsn: result
            .get(0, "acknowledged_lsn")
            .and_then(|t| t.parse().ok()),
        acknowledged_at: result.get(0, "acknowledged_at").map(str::to_owned),
        system_identifier: result.get(0, "system_identifier").map(str::to_owned),
    }))
}

/// The definite error for a slot that is gone after the relay streamed from it.
pub fn lost_slot_message(
    slot: &str,
    table: &QualifiedName,
    record: &SlotRecord,
    config_hint: &str,
) -> String {
    let position = record
        .acknowledged_lsn
        .map_or_else(|| "its start".to_owned(), |lsn| lsn.to_string());
    let when = record
        .acknowledged_at
        .clone()
        .or_else(|| record.first_streamed_at.clone())
        .unwrap_or_else(|| "unknown".to_owned());
    format!(
        "replication slot {slot:?} does not exist, but this relay streamed from it (first at {}; last acknowledged position {position} at {when}, recorded in {table}). It was dropped, removed by max_slot_wal_keep_size, or lost in a failover to a server that did not have it. A new slot would start at the current position and skip every event committed since {position}, so the relay does not create one by itself. Ways out: `outbox-relay slot create --accept-gap {config_hint}` starts a new slot knowingly; then `outbox-relay backfill {config_hint} --since '{when}'` re-sends the outbox rows still in the table from then on (at-least-once: consumers deduplicate by event id)",
        record.first_streamed_at.as_deref().unwrap_or("unknown"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> QualifiedName {
        QualifiedName::parse("public.outbox_relay_state").unwrap()
    }

    /// A lost connection while the state table is created is retried like any other
    /// (the relay used to stop for good on it, a definite error); only a missing
    /// privilege is the operator's.
    #[test]
    fn a_failed_creation_is_definite_only_for_a_missing_privilege() {
        let create = create_table_sql(&table());
        let closed = PgError::Closed {
            addr: "127.0.0.1:5432".into(),
        };
        let error = creation_failed(&table(), &create, closed);
        assert!(
            matches!(&error, SetupError::Pg(PgError::Closed { .. })),
            "{error:?}"
        );
        assert!(error.is_transient(), "{error}");
        let shutting_down = PgError::Db(crate::pg::conn::DbError {
            severity: "FATAL".into(),
            code: "57P01".into(),
            message: "terminating connection due to administrator command".into(),
            detail: None,
            hint: None,
        });
        assert!(creation_failed(&table(), &create, shutting_down).is_transient());
        let denied = PgError::Db(crate::pg::conn::DbError {
            severity: "ERROR".into(),
            code: "42501".into(),
            message: "permission denied for schema public".into(),
            detail: None,
            hint: None,
        });
        let error = creation_failed(&table(), &create, denied);
        assert!(!error.is_transient(), "{error}");
        assert!(
            error.to_string().contains("GRANT SELECT, INSERT, UPDATE"),
            "{error}"
        );
    }

    #[test]
    fn statements_quote_names_and_values() {
        let slot = "s'lot";
        for sql in [
            read_sql(&table(), slot),
            created_sql(&table(), slot, "7"),
            streaming_sql(&table(), slot, "7"),
            acknowledged_sql(&table(), slot, Lsn(0x1_0000_0010)),
            gap_sql(&table(), slot, Some(Lsn(16)), Lsn(32)),
        ] {
            assert!(sql.contains("'s''lot'"), "{sql}");
            assert!(sql.contains("\"public\".\"outbox_relay_state\""), "{sql}");
        }
        assert!(acknowledged_sql(&table(), "s", Lsn(0x1_0000_0010)).contains("'1/10'::pg_lsn"));
        assert!(gap_sql(&table(), "s", None, Lsn(32)).contains("gap_from_lsn = NULL"));
    }

    #[test]
    fn the_lost_slot_message_names_the_gap_and_the_ways_out() {
        let record = SlotRecord {
            created_at: Some("2026-11-30 10:00:00+00".into()),
            first_streamed_at: Some("2026-11-30 10:00:01+00".into()),
            acknowledged_lsn: Some(Lsn(0x1A2B3C)),
            acknowledged_at: Some("2026-12-01 09:00:00+00".into()),
            system_identifier: Some("7".into()),
        };
        assert!(record.streamed());
        let message = lost_slot_message("outbox_relay", &table(), &record, "--config relay.toml");
        for needle in [
            "\"outbox_relay\" does not exist",
            "0/1A2B3C",
            "2026-12-01 09:00:00+00",
            "slot create --accept-gap --config relay.toml",
            "backfill --config relay.toml --since '2026-12-01 09:00:00+00'",
        ] {
            assert!(message.contains(needle), "{needle}: {message}");
        }
    }
}
