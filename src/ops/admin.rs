//! Operator commands beside `run`: `init` (the set-up SQL, printed or applied), `slot
//! status`, `slot drop` and `cleanup`. Thin I/O over the pure SQL of
//! [`crate::pg::init`] and [`crate::pg::cleanup`].

use std::time::{Duration, Instant};

use crate::pg::cleanup;
use crate::pg::conn::{PgConnection, SessionKind};
use crate::pg::diagnose::SetupError;
use crate::pg::init::{setup_sql, InitSpec};
use crate::pg::sql::{quote_literal, QualifiedName};
use crate::pg::state;
use crate::pg::url::ConnectParams;
use crate::relay::settings::Settings;
use crate::relay::RelayError;

fn definite(message: impl Into<String>) -> RelayError {
    SetupError::Definite(message.into()).into()
}

/// The set-up script for `settings`' outbox, publication and state table.
pub fn init_script(
    settings: &Settings,
    partitioned: bool,
    relay_role: &str,
    app_role: &str,
) -> String {
    setup_sql(&InitSpec {
        table: settings.table.clone(),
        state_table: settings.state_table.clone(),
        publication: settings.postgres.publication.clone(),
        partitioned,
        relay_role: relay_role.to_owned(),
        app_role: app_role.to_owned(),
        outbox: settings.outbox_enabled,
        messages: settings.messages.is_some(),
    })
}

/// Runs the set-up script as the user of `admin` (a role that may create roles,
/// tables and publications), in one transaction.
pub async fn apply_script(admin: &ConnectParams, script: &str) -> Result<(), RelayError> {
    let mut conn = PgConnection::connect(admin, SessionKind::Sql).await?;
    let applied = conn
        .simple_query(&format!("BEGIN;\n{script}\nCOMMIT;"))
        .await;
    if let Err(error) = applied {
        let _ = conn.simple_query("ROLLBACK").await;
        return Err(definite(format!(
            "applying the set-up SQL as {:?} failed, nothing was changed: {error} (apply it as a role that may create roles, tables and publications, e.g. --admin-url postgres://postgres@host/db)",
            admin.user
        )));
    }
    conn.close(Duration::from_secs(1)).await;
    Ok(())
}

/// Where the slot stands, as `slot status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotStatus {
    pub slot: String,
    pub exists: bool,
    pub active: bool,
    pub active_pid: Option<u32>,
    pub confirmed_flush_lsn: Option<String>,
    pub restart_lsn: Option<String>,
    pub current_lsn: Option<String>,
    pub wal_status: Option<String>,
    pub invalidation_reason: Option<String>,
    pub failover: bool,
    /// WAL written since the acknowledged position.
    pub lag_bytes: Option<i64>,
    /// WAL the slot keeps (since `restart_lsn`).
    pub retained_bytes: Option<i64>,
    /// How much more WAL may be written before the slot is invalidated
    /// (`max_slot_wal_keep_size`); `None` when unlimited.
    pub safe_wal_size: Option<i64>,
    pub max_slot_wal_keep_size: Option<String>,
    /// `pg_stat_replication.flush_lag` of the streaming walsender, in seconds.
    pub flush_lag_seconds: Option<f64>,
    /// The relay's record: when it last noted an acknowledged position.
    pub recorded_acknowledged_at: Option<String>,
    pub recorded_acknowledged_lsn: Option<String>,
    pub recorded_streamed: bool,
}

impl SlotStatus {
    /// The slot cannot stream what the relay still owes: it was lost (dropped after the
    /// relay streamed from it) or PostgreSQL invalidated it (`wal_status = lost`, or an
    /// `invalidation_reason`). `slot status` exits non-zero then, for scripts and probes.
    pub fn is_lost(&self) -> bool {
        if !self.exists {
            return self.recorded_streamed;
        }
        self.wal_status.as_deref() == Some("lost") || self.invalidation_reason.is_some()
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "slot": self.slot,
            "exists": self.exists,
            "active": self.active,
            "active_pid": self.active_pid,
            "confirmed_flush_lsn": self.confirmed_flush_lsn,
            "restart_lsn": self.restart_lsn,
            "current_lsn": self.current_lsn,
            "wal_status": self.wal_status,
            "invalidation_reason": self.invalidation_reason,
            "failover": self.failover,
            "lost": self.is_lost(),
            "lag_bytes": self.lag_bytes,
            "retained_bytes": self.retained_bytes,
            "safe_wal_size": self.safe_wal_size,
            "max_slot_wal_keep_size": self.max_slot_wal_keep_size,
            "flush_lag_seconds": self.flush_lag_seconds,
            "record": {
                "streamed": self.recorded_streamed,
                "acknowledged_lsn": self.recorded_acknowledged_lsn,
                "acknowledged_at": self.recorded_acknowledged_at,
            },
        })
    }

    /// For people.
    pub fn describe(&self) -> String {
        let show = |value: &Option<String>| value.clone().unwrap_or_else(|| "-".to_owned());
        let bytes = |value: Option<i64>| value.map_or_else(|| "-".to_owned(), human_bytes);
        if !self.exists {
            let mut text = format!("replication slot {:?} does not exist", self.slot);
            if self.recorded_streamed {
                text.push_str(&format!(
                    "; the relay's record says it streamed from it (last acknowledged {} at {}): the slot was lost, see `outbox-relay slot create --accept-gap` and `backfill`",
                    show(&self.recorded_acknowledged_lsn),
                    show(&self.recorded_acknowledged_at)
                ));
            } else {
                text.push_str("; the relay creates it on its first start");
            }
            return text + "\n";
        }
        let mut lines = vec![
            format!("slot                  {}", self.slot),
            format!(
                "active                {}",
                match (self.active, self.active_pid) {
                    (true, Some(pid)) => format!("yes (walsender pid {pid})"),
                    (true, None) => "yes".to_owned(),
                    (false, _) => "no (no relay streams from it now)".to_owned(),
                }
            ),
            format!("confirmed flush LSN   {}", show(&self.confirmed_flush_lsn)),
            format!("restart LSN           {}", show(&self.restart_lsn)),
            format!("current WAL LSN       {}", show(&self.current_lsn)),
            format!(
                "lag                   {} of WAL not yet acknowledged",
                bytes(self.lag_bytes)
            ),
            format!(
                "lag in time           {}",
                self.flush_lag_seconds.map_or_else(
                    || "- (not streaming, or nothing to catch up)".to_owned(),
                    |s| format!("{s:.3} s (walsender flush_lag)")
                )
            ),
            format!("retained WAL          {}", bytes(self.retained_bytes)),
            format!(
                "wal_status            {}{}",
                show(&self.wal_status),
                self.invalidation_reason
                    .as_ref()
                    .map_or_else(String::new, |r| format!(" (invalidation_reason {r})"))
            ),
            format!(
                "max_slot_wal_keep_size {}{}",
                show(&self.max_slot_wal_keep_size),
                self.safe_wal_size.map_or_else(String::new, |s| format!(
                    " ({} more before invalidation)",
                    human_bytes(s)
                ))
            ),
            format!(
                "failover slot         {}",
                if self.failover { "yes" } else { "no" }
            ),
            format!(
                "last recorded ack     {} at {}",
                show(&self.recorded_acknowledged_lsn),
                show(&self.recorded_acknowledged_at)
            ),
        ];
        lines.push(String::new());
        lines.join("\n")
    }
}

fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {} ({bytes} bytes)", UNITS[unit])
    }
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

/// What `cleanup` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    pub deleted_rows: u64,
    pub dropped_partitions: Vec<String>,
    pub cutoff: String,
}

/// How `cleanup` runs.
#[derive(Debug, Clone)]
pub struct CleanupOptions {
    /// A PostgreSQL interval: rows older than this go.
    pub older_than: String,
    /// The outbox's timestamp column.
    pub column: String,
    /// Rows per DELETE transaction.
    pub batch: u32,
    /// How long to wait for the slot to reach the position of the cleanup's snapshot.
    pub wait: Duration,
    /// Connect as this role (one with DELETE on the outbox, owning its partitions to
    /// drop them) instead of the relay's.
    pub admin: Option<ConnectParams>,
}

/// `cleanup`: deletes outbox rows older than the cutoff that the slot has provably
/// passed ([`crate::pg::cleanup`]); refuses when the relay lags behind.
pub async fn cleanup(
    settings: &Settings,
    options: &CleanupOptions,
) -> Result<CleanupReport, RelayError> {
    let spec = settings.source();
    let connect = options.admin.as_ref().unwrap_or(&settings.connect);
    let mut conn = PgConnection::connect(connect, SessionKind::Sql).await?;
    let start = conn
        .simple_query(&cleanup::start_sql(&options.older_than))
        .await
        .map_err(|e| {
            definite(format!(
                "--older-than {:?} is not a PostgreSQL interval (like '7 days'): {e}",
                options.older_than
            ))
        })?;
    let (Some(snapshot), Some(position), Some(cutoff)) = (
        start.get(0, "snapshot").map(str::to_owned),
        start.get(0, "position").map(str::to_owned),
        start.get(0, "cutoff").map(str::to_owned),
    ) else {
        return Err(definite("PostgreSQL returned no snapshot for the cleanup"));
    };
    // Everything committed before this moment must be acknowledged by the slot.
    let deadline = Instant::now() + options.wait;
    loop {
        let slot = conn
            .simple_query(&format!(
                "SELECT confirmed_flush_lsn::text AS confirmed, \
                        confirmed_flush_lsn >= {}::pg_lsn AS passed, \
                        pg_catalog.pg_wal_lsn_diff({}::pg_lsn, confirmed_flush_lsn)::bigint AS behind \
                   FROM pg_catalog.pg_replication_slots WHERE slot_name = {}",
                quote_literal(&position),
                quote_literal(&position),
                quote_literal(&spec.slot)
            ))
            .await?;
        if slot.rows.is_empty() {
            return Err(definite(format!(
                "replication slot {:?} does not exist, so nothing proves that the outbox rows were relayed: cleanup deletes nothing",
                spec.slot
            )));
        }
        if slot.get(0, "passed") == Some("t") {
            break;
        }
        if Instant::now() >= deadline {
            return Err(definite(format!(
                "the relay lags behind the rows cleanup would delete: slot {:?} has acknowledged {} but the outbox holds rows committed up to {position} ({} bytes of WAL later), so some may not be in Kafka yet; nothing was deleted. Run cleanup again once the relay streams and has caught up (`outbox-relay slot status`)",
                spec.slot,
                slot.get(0, "confirmed").unwrap_or("nothing"),
                slot.get(0, "behind").unwrap_or("?"),
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut report = CleanupReport {
        cutoff: cutoff.clone(),
        ..CleanupReport::default()
    };
    let leaves = conn
        .simple_query(&cleanup::leaves_sql(&settings.table))
        .await?;
    for row in 0..leaves.rows.len() {
        let leaf = QualifiedName {
            schema: leaves.get(row, "schema").unwrap_or_default().to_owned(),
            name: leaves.get(row, "name").unwrap_or_default().to_owned(),
        };
        if let Some(upper) = leaves.get(row, "upper_bound") {
            let check = conn
                .simple_query(&cleanup::partition_droppable_sql(
                    &leaf, upper, &snapshot, &cutoff,
                ))
                .await?;
            if check.get(0, "droppable") == Some("t") {
                conn.simple_query(&format!("DROP TABLE {}", leaf.quoted()))
                    .await?;
                tracing::info!(partition = %leaf, upper_bound = upper, "dropped an outbox partition the slot has passed");
                report.dropped_partitions.push(leaf.to_string());
                continue;
            }
        }
        loop {
            let deleted = conn
                .simple_query(&cleanup::delete_batch_sql(
                    &leaf,
                    &options.column,
                    &snapshot,
                    &cutoff,
                    options.batch,
                ))
                .await
                .map_err(|e| definite(format!("deleting from {leaf} as {:?} failed: {e} (the role needs DELETE on the outbox: give one with --admin-url; and is --column {:?} the outbox's timestamp column?)", connect.user, options.column)))?;
            let n: u64 = deleted
                .get(0, "deleted")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            report.deleted_rows += n;
            if n < u64::from(options.batch) {
                break;
            }
        }
    }
    conn.close(Duration::from_secs(1)).await;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::SlotStatus;

    fn status(
        exists: bool,
        wal_status: Option<&str>,
        reason: Option<&str>,
        streamed: bool,
    ) -> SlotStatus {
        SlotStatus {
            slot: "outbox_relay".into(),
            exists,
            active: false,
            active_pid: None,
            confirmed_flush_lsn: None,
            restart_lsn: None,
            current_lsn: None,
            wal_status: wal_status.map(str::to_owned),
            invalidation_reason: reason.map(str::to_owned),
            failover: false,
            lag_bytes: None,
            retained_bytes: None,
            safe_wal_size: None,
            max_slot_wal_keep_size: None,
            flush_lag_seconds: None,
            recorded_acknowledged_at: None,
            recorded_acknowledged_lsn: None,
            recorded_streamed: streamed,
        }
    }

    #[test]
    fn a_slot_is_lost_when_dropped_after_streaming_or_invalidated() {
        // Not created yet: the relay creates it; nothing is owed.
        assert!(!status(false, None, None, false).is_lost());
        // Gone after the relay streamed from it.
        assert!(status(false, None, None, true).is_lost());
        for usable in ["reserved", "extended", "unreserved"] {
            assert!(
                !status(true, Some(usable), None, true).is_lost(),
                "{usable}"
            );
        }
        assert!(status(true, Some("lost"), None, true).is_lost());
        // PostgreSQL 16+ names why (rows_removed, wal_level_insufficient, ...).
        assert!(status(true, Some("reserved"), Some("rows_removed"), true).is_lost());
        assert_eq!(
            status(true, Some("lost"), None, true).to_json()["lost"],
            true
        );
    }
}
