//! `outbox-relay slot`: create the replication slot (past a lost slot's gap only when
//! asked), read where it stands, drop it. Thin I/O over [`crate::pg::slot`] and the
//! relay's record ([`crate::pg::state`]): the record is what keeps a slot the relay
//! streamed from from being replaced silently, so `create` refuses over it without
//! `--accept-gap` and writes the gap, and `drop` keeps it unless told to forget.

use std::time::Duration;

use crate::pg::conn::{PgConnection, SessionKind};
use crate::pg::slot;
use crate::pg::sql::quote_literal;
use crate::pg::state;
use crate::relay::settings::Settings;
use crate::relay::RelayError;

use super::definite;
use super::slot_report::{CreatedSlot, SlotStatus};

/// Creates the slot. When the record says an earlier slot of that name was streamed
/// from (so events between its last acknowledged position and now were never relayed),
/// only with `accept_gap`; the gap is written to the record.
pub async fn create_slot(settings: &Settings, accept_gap: bool) -> Result<CreatedSlot, RelayError> {
    let spec = settings.source();
    let mut conn =
        PgConnection::connect(&settings.connect, SessionKind::LogicalReplication).await?;
    let exists = conn
        .simple_query(&format!(
            "SELECT confirmed_flush_lsn::text AS lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = {}",
            quote_literal(&spec.slot)
        ))
        .await?;
    if !exists.rows.is_empty() {
        return Err(definite(format!(
            "replication slot {:?} already exists (acknowledged up to {}): there is nothing to create; `outbox-relay run` streams from it",
            spec.slot,
            exists.get(0, "lsn").unwrap_or("an unknown position")
        )));
    }
    state::ensure_table(&mut conn, &spec.state_table).await?;
    let record = state::read(&mut conn, &spec.state_table, &spec.slot).await?;
    let lost = record.filter(state::SlotRecord::streamed);
    if let Some(record) = &lost {
        if !accept_gap {
            return Err(definite(state::lost_slot_message(
                &spec.slot,
                &spec.state_table,
                record,
                "--config FILE",
            )));
        }
    }
    // The publication first: the slot streams what is published from its start on.
    let publication_created = slot::ensure_publication_for_slot(&mut conn, &spec).await?;
    let identify = conn.simple_query("IDENTIFY_SYSTEM").await?;
    let system_id = identify.get(0, "systemid").unwrap_or_default().to_owned();
    let version_num = slot::server_version_num(&mut conn).await?;
    let failover = spec.failover && version_num >= slot::FAILOVER_SLOTS_SINCE;
    let start = slot::create_slot(&mut conn, &spec, &system_id, failover).await?;
    let gap_from = match lost {
        Some(record) => {
            conn.simple_query(&state::gap_sql(
                &spec.state_table,
                &spec.slot,
                record.acknowledged_lsn,
                start,
            ))
            .await?;
            tracing::warn!(
                slot = %spec.slot,
                gap_from = %record.acknowledged_lsn.map_or_else(|| "unknown".to_owned(), |l| l.to_string()),
                gap_to = %start,
                "created the slot past a gap, as asked: events committed in the gap were not relayed"
            );
            Some((record.acknowledged_lsn, record.acknowledged_at))
        }
        None => None,
    };
    Ok(CreatedSlot {
        slot: spec.slot,
        start,
        gap_from,
        publication_created,
    })
}

/// `slot status`: the slot as PostgreSQL and the relay's record see it.
pub async fn slot_status(settings: &Settings) -> Result<SlotStatus, RelayError> {
    let spec = settings.source();
    let mut conn = PgConnection::connect(&settings.connect, SessionKind::Sql).await?;
    let slot = quote_literal(&spec.slot);
    // The current position of a standby is its replay position.
    let found = conn
        .simple_query(&format!(
            "WITH here AS (SELECT CASE WHEN pg_catalog.pg_is_in_recovery() \
                                  THEN pg_catalog.pg_last_wal_replay_lsn() \
                                  ELSE pg_catalog.pg_current_wal_lsn() END AS lsn) \
             SELECT s.active, s.active_pid, s.confirmed_flush_lsn::text AS confirmed_flush_lsn, \
                    s.restart_lsn::text AS restart_lsn, here.lsn::text AS current_lsn, \
                    s.wal_status, s.safe_wal_size, \
                    pg_catalog.to_jsonb(s) ->> 'invalidation_reason' AS invalidation_reason, \
                    coalesce((pg_catalog.to_jsonb(s) ->> 'failover')::boolean, false) AS failover, \
                    pg_catalog.pg_wal_lsn_diff(here.lsn, s.confirmed_flush_lsn)::bigint AS lag_bytes, \
                    pg_catalog.pg_wal_lsn_diff(here.lsn, s.restart_lsn)::bigint AS retained_bytes, \
                    pg_catalog.current_setting('max_slot_wal_keep_size') AS max_slot_wal_keep_size, \
                    (SELECT extract(epoch FROM r.flush_lag) FROM pg_catalog.pg_stat_replication r \
                      WHERE r.pid = s.active_pid) AS flush_lag_seconds \
               FROM pg_catalog.pg_replication_slots s, here WHERE s.slot_name = {slot}"
        ))
        .await?;
    // No record table (yet): nothing recorded.
    let record = state::read(&mut conn, &spec.state_table, &spec.slot)
        .await
        .unwrap_or_default();
    let resolved = crate::pg::slot::resolve_tables(&mut conn, &spec).await?;
    let mut tables = Vec::with_capacity(resolved.tables.len());
    for table in &resolved.tables {
        let published = crate::pg::slot::is_published(&mut conn, &spec.publication, table)
            .await
            .ok();
        tables.push((table.to_string(), published));
    }
    conn.close(Duration::from_secs(1)).await;
    let get = |column: &str| found.get(0, column).map(str::to_owned);
    let number = |column: &str| found.get(0, column).and_then(|v| v.parse::<i64>().ok());
    Ok(SlotStatus {
        slot: spec.slot.clone(),
        exists: !found.rows.is_empty(),
        active: found.get(0, "active") == Some("t"),
        active_pid: found.get(0, "active_pid").and_then(|p| p.parse().ok()),
        confirmed_flush_lsn: get("confirmed_flush_lsn"),
        restart_lsn: get("restart_lsn"),
        current_lsn: get("current_lsn"),
        wal_status: get("wal_status"),
        invalidation_reason: get("invalidation_reason"),
        failover: found.get(0, "failover") == Some("t"),
        lag_bytes: number("lag_bytes"),
        retained_bytes: number("retained_bytes"),
        safe_wal_size: number("safe_wal_size"),
        max_slot_wal_keep_size: get("max_slot_wal_keep_size"),
        flush_lag_seconds: found
            .get(0, "flush_lag_seconds")
            .and_then(|v| v.parse().ok()),
        recorded_acknowledged_at: record.as_ref().and_then(|r| r.acknowledged_at.clone()),
        recorded_acknowledged_lsn: record
            .as_ref()
            .and_then(|r| r.acknowledged_lsn)
            .map(|l| l.to_string()),
        recorded_streamed: record.as_ref().is_some_and(state::SlotRecord::streamed),
        tables,
    })
}

/// `slot drop`: drops the slot (refused while a relay streams from it). The relay's
/// record stays, so a relay started later refuses to replace the slot silently; with
/// `forget`, the record goes too (decommissioning).
pub async fn slot_drop(settings: &Settings, forget: bool) -> Result<String, RelayError> {
    let spec = settings.source();
    let mut conn = PgConnection::connect(&settings.connect, SessionKind::Sql).await?;
    let found = conn
        .simple_query(&format!(
            "SELECT active, active_pid FROM pg_catalog.pg_replication_slots WHERE slot_name = {}",
            quote_literal(&spec.slot)
        ))
        .await?;
    let mut said = Vec::new();
    if found.rows.is_empty() {
        said.push(format!("replication slot {:?} does not exist", spec.slot));
    } else if found.get(0, "active") == Some("t") {
        return Err(definite(format!(
            "replication slot {:?} is in use by walsender pid {}: stop the relay (every instance) first, then drop it",
            spec.slot,
            found.get(0, "active_pid").unwrap_or("?")
        )));
    } else {
        conn.simple_query(&format!(
            "SELECT pg_catalog.pg_drop_replication_slot({})",
            quote_literal(&spec.slot)
        ))
        .await?;
        said.push(format!("dropped replication slot {:?}", spec.slot));
    }
    if forget {
        let forgot = conn
            .simple_query(&format!(
                "DELETE FROM {} WHERE slot_name = {}",
                spec.state_table.quoted(),
                quote_literal(&spec.slot)
            ))
            .await;
        match forgot {
            Ok(_) => said.push(format!(
                "removed the relay's record of it from {}: a relay started on this config creates a new slot at the current position",
                spec.state_table
            )),
            Err(error) => said.push(format!(
                "could not remove the relay's record from {}: {error}",
                spec.state_table
            )),
        }
    } else {
        said.push(format!(
            "the relay's record in {} stays: a relay started on this config refuses to create a new slot silently (events would be skipped); to stream again, `outbox-relay slot create --accept-gap` and `backfill`, or drop with --forget when decommissioning",
            spec.state_table
        ));
    }
    conn.close(Duration::from_secs(1)).await;
    Ok(said.join("; "))
}
