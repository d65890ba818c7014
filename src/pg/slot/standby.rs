//! Decoding on a hot standby (PostgreSQL 16+, `[postgres] primary_url`): what the
//! preparation does on the primary because a server in recovery cannot.
//!
//! ```text
//!  relay ──replication──▶ standby (slot, WAL sender, decoding)
//!    │                      ▲ replays the primary's WAL: publication, state table,
//!    │                      │ the relay's record, the running-xacts records
//!    └──SQL──▶ primary ─────┘
//!              CREATE PUBLICATION / state table      (then wait until replayed)
//!              pg_log_standby_snapshot()            (while the slot is created)
//!              the relay's record                    (the watch, after streaming)
//! ```
//!
//! A logical slot created on a standby waits for a running-xacts record from the
//! primary to find a consistent point; an idle primary writes one only every 15 s, and
//! only after other WAL, so the creation could wait for ever. The relay asks the
//! primary for one (`pg_log_standby_snapshot()`) every half second until the slot
//! exists; a role that may not call it gets a warning saying so, and the wait goes on
//! (any write on the primary ends it).

use std::future::Future;
use std::time::Duration;

use crate::pg::conn::{PgConnection, PgError, SessionKind};
use crate::pg::diagnose::SetupError;
use crate::pg::url::ConnectParams;
use crate::Lsn;

/// PostgreSQL 16 (`server_version_num`) decodes on a standby.
pub const STANDBY_DECODING_SINCE: u32 = 160_000;

/// How often the primary is asked for a snapshot while a slot is created.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(500);
/// How long the standby may take to replay what the relay wrote on the primary.
const REPLAY_WAIT: Duration = Duration::from_secs(60);

fn definite(message: impl Into<String>) -> SetupError {
    SetupError::Definite(message.into())
}

/// A session on the primary, which must be one (not in recovery) with
/// `wal_level = logical`.
pub(super) async fn connect_primary(primary: &ConnectParams) -> Result<PgConnection, SetupError> {
    let mut conn = PgConnection::connect(primary, SessionKind::Sql).await?;
    let found = conn
        .simple_query(
            "SELECT pg_catalog.pg_is_in_recovery() AS recovery, current_setting('wal_level') AS wal_level",
        )
        .await?;
    if found.get(0, "recovery") == Some("t") {
        return Err(definite(format!(
            "[postgres] primary_url points at {}, which is in recovery too: it must name the primary the standby replays from",
            primary.redacted()
        )));
    }
    let wal_level = found.get(0, "wal_level").unwrap_or("unknown");
    if wal_level != "logical" {
        return Err(definite(format!(
            "the primary ({}) has wal_level={wal_level}: decoding on a standby needs wal_level=logical on the primary (ALTER SYSTEM SET wal_level = logical there, and restart it)",
            primary.redacted()
        )));
    }
    Ok(conn)
}

/// Waits until the standby (`standby`) has replayed the primary's WAL up to where it
/// is now: what the relay just wrote there is then visible on the standby.
pub(crate) async fn wait_replayed(
    standby: &mut PgConnection,
    primary: &mut PgConnection,
) -> Result<(), SetupError> {
    let target = current_lsn(primary, "pg_current_wal_lsn").await?;
    let deadline = tokio::time::Instant::now() + REPLAY_WAIT;
    loop {
        let replayed = current_lsn(standby, "pg_last_wal_replay_lsn").await?;
        if replayed >= target {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(definite(format!(
                "the standby has not replayed the primary's WAL up to {target} within {} s (it stands at {replayed}): is it streaming from that primary (pg_stat_wal_receiver), or is replay paused?",
                REPLAY_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn current_lsn(conn: &mut PgConnection, function: &str) -> Result<Lsn, SetupError> {
    let found = conn
        .simple_query(&format!("SELECT pg_catalog.{function}()::text AS lsn"))
        .await?;
    Ok(found
        .get(0, "lsn")
        .and_then(|lsn| lsn.parse().ok())
        .unwrap_or(Lsn::ZERO))
}

/// Runs `work` (the slot's creation on the standby) while asking the primary for a
/// running-xacts record every [`SNAPSHOT_EVERY`]; without a primary, `work` alone.
pub(super) async fn while_asking_for_snapshots<T>(
    primary: Option<&mut PgConnection>,
    work: impl Future<Output = T>,
) -> Result<T, SetupError> {
    let Some(primary) = primary else {
        return Ok(work.await);
    };
    tokio::pin!(work);
    let mut ticks = tokio::time::interval(SNAPSHOT_EVERY);
    let mut refused = false;
    loop {
        tokio::select! {
            done = &mut work => return Ok(done),
            _ = ticks.tick(), if !refused => {
                match primary.simple_query("SELECT pg_catalog.pg_log_standby_snapshot()").await {
                    Ok(_) => {}
                    Err(PgError::Db(db)) if db.code == "42501" => {
                        refused = true;
                        tracing::warn!(
                            error = %db.message,
                            "the slot is being created on the standby, which waits for the primary to log a snapshot of its running transactions; this role may not ask for one (GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO the relay's role on the primary), so the creation waits for the primary's next write"
                        );
                    }
                    Err(error) => return Err(error.into()),
                }
            }
        }
    }
}
