//! `outbox-relay cleanup`: deletes rows of every outbox table older than a cutoff that the slot has
//! provably passed, and drops whole old partitions; refuses when the relay lags behind.
//! The I/O around the pure SQL of [`super::cleanup_sql`], whose module doc carries the
//! correctness argument.

use std::time::{Duration, Instant};

use crate::pg::conn::{PgConnection, SessionKind};
use crate::pg::sql::{quote_literal, QualifiedName};
use crate::pg::url::ConnectParams;
use crate::relay::settings::Settings;
use crate::relay::RelayError;

use super::cleanup_sql;
use super::definite;

/// What `cleanup` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanupReport {
    pub deleted_rows: u64,
    pub dropped_partitions: Vec<String>,
    pub cutoff: String,
}

impl CleanupReport {
    /// What `cleanup` tells the operator.
    pub fn said(&self) -> String {
        format!(
            "cleanup: deleted {} rows older than {} that the slot has passed{}",
            self.deleted_rows,
            self.cutoff,
            if self.dropped_partitions.is_empty() {
                String::new()
            } else {
                format!(
                    "; dropped partitions {}",
                    self.dropped_partitions.join(", ")
                )
            }
        )
    }
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
/// passed ([`super::cleanup_sql`]); refuses when the relay lags behind.
pub async fn cleanup(
    settings: &Settings,
    options: &CleanupOptions,
) -> Result<CleanupReport, RelayError> {
    let spec = settings.source();
    let connect = options.admin.as_ref().unwrap_or(&settings.connect);
    let mut conn = PgConnection::connect(connect, SessionKind::Sql).await?;
    let start = conn
        .simple_query(&cleanup_sql::start_sql(&options.older_than))
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
    // Every outbox table's leaves (the table itself, or its partitions), with the
    // upper bound of a range partition.
    let mut leaves: Vec<(QualifiedName, Option<String>)> = Vec::new();
    let tables = crate::pg::slot::resolve_tables(&mut conn, &spec)
        .await?
        .tables;
    for table in tables {
        let found = conn.simple_query(&cleanup_sql::leaves_sql(&table)).await?;
        for row in 0..found.rows.len() {
            let leaf = QualifiedName {
                schema: found.get(row, "schema").unwrap_or_default().to_owned(),
                name: found.get(row, "name").unwrap_or_default().to_owned(),
            };
            leaves.push((leaf, found.get(row, "upper_bound").map(str::to_owned)));
        }
    }
    for (leaf, upper) in leaves {
        if let Some(upper) = upper.as_deref() {
            let check = conn
                .simple_query(&cleanup_sql::partition_droppable_sql(
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
                .simple_query(&cleanup_sql::delete_batch_sql(
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
