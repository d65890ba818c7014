//! Preparing the source: checks that logical decoding can work, creates the publication
//! and the `pgoutput` slot when missing, and builds the `START_REPLICATION` command.
//!
//! Every failure here is definite: the message says what is wrong and how to fix it.
//! The outbox table's and the publication's checks are in `slot/publication.rs`; this
//! file keeps the order of the steps, the slot's own, and the replication command.

mod publication;
mod standby;

use std::time::Duration;

use crate::pg::conn::{PgConnection, PgError, QueryResult};
pub use crate::pg::diagnose::SetupError;
pub use crate::pg::source::{OutboxRelation, SourceSpec};
use crate::pg::sql::{quote_ident, quote_literal};
use crate::pg::state;
use crate::pg::url::ConnectParams;
use crate::Lsn;
pub use publication::{
    create_publication_sql, is_published, join_publication, matching_tables,
    read_publication_tables, resolve_tables,
};
use publication::{ensure_publication, outbox_relations};
pub(crate) use standby::wait_replayed;

/// PostgreSQL 14 (`server_version_num`) brought pgoutput's `messages` option.
pub const MESSAGES_SINCE: u32 = 140_000;

/// The result of [`prepare`].
#[derive(Debug, Clone)]
pub struct PreparedSource {
    pub system_id: String,
    pub timeline: u32,
    /// The end of the server's flushed WAL when the session began (`IDENTIFY_SYSTEM`'s
    /// `xlogpos`).
    pub wal_end: Lsn,
    /// Where the slot stands (`confirmed_flush_lsn`), or where it was created.
    pub slot_lsn: Lsn,
    pub slot_created: bool,
    pub publication_created: bool,
    pub wal_sender_timeout: Option<Duration>,
    pub server_version: String,
    /// The outbox tables as found (relation ids: the stream names them by these), in
    /// the spec's order; none for a messages-only relay.
    pub outboxes: Vec<OutboxRelation>,
    /// The slot is a failover slot (PostgreSQL 17+).
    pub failover_slot: bool,
    /// The relay's record of the slot in its state table, as read before streaming
    /// (its acknowledged position: [`crate::relay::record`]).
    pub record: Option<state::SlotRecord>,
    /// The server is a standby the relay decodes on (`[postgres] primary_url`).
    pub on_standby: bool,
}

fn definite(message: impl Into<String>) -> SetupError {
    SetupError::Definite(message.into())
}

/// The server's version as it reports it at start-up (`server_version`).
fn server_version_text(conn: &PgConnection) -> String {
    conn.parameter("server_version")
        .unwrap_or("unknown")
        .to_owned()
}

/// Check the server, create what is missing, and report where the slot stands.
/// `primary`: `[postgres] primary_url`; with it a server in recovery (PostgreSQL 16+)
/// is decoded on, and what it cannot do is done on the primary (`slot/standby.rs`).
pub async fn prepare(
    conn: &mut PgConnection,
    spec: &SourceSpec,
    primary: Option<&ConnectParams>,
) -> Result<PreparedSource, SetupError> {
    let server_version = server_version_text(conn);
    let wal_level = conn.simple_query("SHOW wal_level").await?;
    let wal_level = wal_level
        .rows
        .first()
        .and_then(|r| r.first().cloned().flatten());
    if wal_level.as_deref() != Some("logical") {
        return Err(SetupError::WalLevel {
            found: wal_level.unwrap_or_else(|| "unknown".to_owned()),
        });
    }

    // PostgreSQL 16 and later decode on a standby too, and such a stream would run on
    // through a promotion unnoticed; before 16 the server refuses it ("logical decoding
    // cannot be used while in recovery"). Wait for a primary on every version.
    let version_num = server_version_num(conn).await?;
    let recovery = conn
        .simple_query("SELECT pg_catalog.pg_is_in_recovery() AS recovery")
        .await?;
    let mut primary_conn = match (recovery.get(0, "recovery") == Some("t"), primary) {
        (false, _) => None,
        (true, None) => return Err(SetupError::InRecovery),
        (true, Some(_)) if version_num < standby::STANDBY_DECODING_SINCE => {
            return Err(definite(format!(
                "this server is a standby and [postgres] primary_url asks to decode on it, which needs PostgreSQL 16 or later (it runs {server_version}): upgrade, or remove primary_url to wait for a promotion"
            )))
        }
        (true, Some(primary)) => Some(standby::connect_primary(primary).await?),
    };

    let identify = conn.simple_query("IDENTIFY_SYSTEM").await?;
    let system_id = identify.get(0, "systemid").unwrap_or_default().to_owned();
    let timeline = identify
        .get(0, "timeline")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let wal_end = identify
        .get(0, "xlogpos")
        .and_then(|lsn| lsn.parse().ok())
        .unwrap_or(Lsn::ZERO);

    if spec.messages && version_num < MESSAGES_SINCE {
        return Err(definite(format!(
            "PostgreSQL {server_version} cannot send logical decoding messages to the relay: pgoutput's messages option (for [messages], the table-less outbox) needs PostgreSQL 14 or later; upgrade PostgreSQL, or remove [messages] (set enabled = false) and relay the outbox table"
        )));
    }

    // The tables the patterns match now join the spec's own.
    let spec = &publication::resolve_tables(conn, spec).await?;
    let outboxes = outbox_relations(conn, spec, &server_version, version_num).await?;
    let partitioned = outboxes.iter().any(|o| o.partitioned);

    // Another process streams from the slot: stop here, before anything is written (a
    // standby retrying every 100-200 ms must not touch the database).
    if let Some(pid) = active_pid(conn, &spec.slot).await? {
        return Err(SetupError::SlotActive {
            slot: spec.slot.clone(),
            pid,
        });
    }
    // A standby cannot write: the publication and the state table are made on the
    // primary, and the standby replays them before the slot is looked at.
    let publication_created = match primary_conn.as_mut() {
        None => {
            let created = ensure_publication(conn, spec, partitioned).await?;
            state::ensure_table(conn, &spec.state_table).await?;
            created
        }
        Some(primary) => {
            let created = ensure_publication(primary, spec, partitioned).await?;
            state::ensure_table(primary, &spec.state_table).await?;
            standby::wait_replayed(conn, primary).await?;
            created
        }
    };
    // A slot created on a standby cannot be a failover slot.
    let failover_slot =
        spec.failover && version_num >= FAILOVER_SLOTS_SINCE && primary_conn.is_none();
    let (slot_lsn, slot_created) =
        ensure_slot(conn, spec, &system_id, failover_slot, primary_conn.as_mut()).await?;
    if failover_slot {
        warn_without_synchronized_standbys(conn, &spec.slot).await?;
    }
    // From here on the slot is streamed from: losing it loses events. Written once, not
    // at every start (an UPDATE to the same values is a write all the same).
    let recorded = state::read(conn, &spec.state_table, &spec.slot).await?;
    if !recorded.as_ref().is_some_and(state::SlotRecord::streamed) {
        let sql = state::streaming_sql(&spec.state_table, &spec.slot, &system_id);
        match primary_conn.as_mut() {
            None => conn.simple_query(&sql).await?,
            Some(primary) => primary.simple_query(&sql).await?,
        };
    }
    let on_standby = primary_conn.is_some();
    if let Some(primary) = primary_conn {
        primary.close(Duration::from_secs(1)).await;
    }

    let timeout = conn.simple_query("SHOW wal_sender_timeout").await?;
    let wal_sender_timeout = timeout
        .rows
        .first()
        .and_then(|r| r.first().cloned().flatten())
        .and_then(|text| parse_pg_duration(&text));

    Ok(PreparedSource {
        system_id,
        timeline,
        wal_end,
        slot_lsn,
        slot_created,
        publication_created,
        wal_sender_timeout,
        server_version,
        outboxes,
        failover_slot,
        record: recorded,
        on_standby,
    })
}

/// Creates the publication if it is missing (and checks it as [`prepare`] does), before
/// a slot is created on its own (`slot create`): a slot streams only what is published
/// from its start on, so a publication created after it would leave the slot unable to
/// stream ("publication does not exist" at the WAL it reads). Returns whether it created
/// one.
pub async fn ensure_publication_for_slot(
    conn: &mut PgConnection,
    spec: &SourceSpec,
) -> Result<bool, SetupError> {
    let server_version = server_version_text(conn);
    let version_num = server_version_num(conn).await?;
    let spec = &publication::resolve_tables(conn, spec).await?;
    let partitioned = outbox_relations(conn, spec, &server_version, version_num)
        .await?
        .iter()
        .any(|o| o.partitioned);
    ensure_publication(conn, spec, partitioned).await
}

/// The process streaming from `slot`, if any.
pub async fn active_pid(conn: &mut PgConnection, slot: &str) -> Result<Option<i32>, PgError> {
    let found = conn
        .simple_query(&format!(
            "SELECT active_pid FROM pg_catalog.pg_replication_slots WHERE slot_name = {} AND active_pid IS NOT NULL",
            quote_literal(slot)
        ))
        .await?;
    Ok(found.get(0, "active_pid").and_then(|pid| pid.parse().ok()))
}

/// The server's `server_version_num` (e.g. 170004), 0 when it cannot be read.
pub async fn server_version_num(conn: &mut PgConnection) -> Result<u32, PgError> {
    Ok(conn
        .simple_query("SHOW server_version_num")
        .await?
        .rows
        .first()
        .and_then(|r| r.first().cloned().flatten())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

/// PostgreSQL 17 (`server_version_num`) brought failover slots.
pub const FAILOVER_SLOTS_SINCE: u32 = 170_000;

/// A failover slot reaches a standby only if the primary waits for it: without
/// `synchronized_standby_slots`, a standby can be promoted with the slot behind what the
/// relay was sent, or without it.
async fn warn_without_synchronized_standbys(
    conn: &mut PgConnection,
    slot: &str,
) -> Result<(), SetupError> {
    let setting = conn.simple_query("SHOW synchronized_standby_slots").await?;
    let value = setting
        .rows
        .first()
        .and_then(|r| r.first().cloned().flatten())
        .unwrap_or_default();
    if value.trim().is_empty() {
        tracing::warn!(
            %slot,
            "the primary has no synchronized_standby_slots: a failover to a standby could lose the slot (or its position); set synchronized_standby_slots to the standbys' physical slots and sync_replication_slots = on on the standbys"
        );
    }
    Ok(())
}

async fn ensure_slot(
    conn: &mut PgConnection,
    spec: &SourceSpec,
    system_id: &str,
    failover: bool,
    mut primary: Option<&mut PgConnection>,
) -> Result<(Lsn, bool), SetupError> {
    let slot = &spec.slot;
    let found = conn
        .simple_query(&format!(
            // invalidation_reason exists from PostgreSQL 17 on, failover from 17 on;
            // through jsonb they read as NULL on older versions instead of failing.
            // conflicting (16+): a slot on a standby invalidated by a recovery conflict.
            "SELECT plugin, slot_type, database, wal_status, \
                    pg_catalog.to_jsonb(s) ->> 'invalidation_reason' AS invalidation_reason, \
                    coalesce((pg_catalog.to_jsonb(s) ->> 'conflicting')::boolean, false) AS conflicting, \
                    confirmed_flush_lsn, current_database() AS current_db, \
                    coalesce((pg_catalog.to_jsonb(s) ->> 'failover')::boolean, false) AS failover \
               FROM pg_catalog.pg_replication_slots s WHERE slot_name = {}",
            quote_literal(slot)
        ))
        .await?;
    if found.rows.is_empty() {
        if let Some(record) = state::read(conn, &spec.state_table, slot).await? {
            if record.streamed() {
                return Err(definite(state::lost_slot_message(
                    slot,
                    &spec.state_table,
                    &record,
                    "--config FILE",
                )));
            }
        }
        if primary.is_none() {
            return Ok((create_slot(conn, spec, system_id, failover).await?, true));
        }
        // On a standby: created there while the primary is asked for snapshots, the
        // record started over on the primary.
        let creating = make_slot(conn, spec, failover);
        let lsn = standby::while_asking_for_snapshots(primary.as_deref_mut(), creating).await??;
        if let Some(primary) = primary {
            primary
                .simple_query(&state::created_sql(&spec.state_table, slot, system_id))
                .await?;
        }
        tracing::info!(%slot, %lsn, "created replication slot on the standby");
        return Ok((lsn, true));
    }
    check_existing_slot(&found, slot, primary.is_some())?;
    if failover && found.get(0, "failover") != Some("t") {
        conn.simple_query(&format!(
            "ALTER_REPLICATION_SLOT {} (FAILOVER true)",
            quote_ident(slot)
        ))
        .await?;
        tracing::info!(%slot, "made the slot a failover slot ([postgres] failover_slot)");
    }
    let lsn = found
        .get(0, "confirmed_flush_lsn")
        .and_then(|t| t.parse().ok())
        .unwrap_or_default();
    Ok((lsn, false))
}

/// Creates the slot and starts its record over. Returns where it starts.
pub async fn create_slot(
    conn: &mut PgConnection,
    spec: &SourceSpec,
    system_id: &str,
    failover: bool,
) -> Result<Lsn, SetupError> {
    let lsn = make_slot(conn, spec, failover).await?;
    conn.simple_query(&state::created_sql(
        &spec.state_table,
        &spec.slot,
        system_id,
    ))
    .await?;
    tracing::info!(slot = %spec.slot, %lsn, "created replication slot");
    Ok(lsn)
}

/// `CREATE_REPLICATION_SLOT`; where the slot starts.
async fn make_slot(
    conn: &mut PgConnection,
    spec: &SourceSpec,
    failover: bool,
) -> Result<Lsn, SetupError> {
    let slot = &spec.slot;
    let command = if failover {
        format!(
            "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER true)",
            quote_ident(slot)
        )
    } else {
        format!(
            "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput NOEXPORT_SNAPSHOT",
            quote_ident(slot)
        )
    };
    let created = conn
            .simple_query(&command)
            .await
            .map_err(|e| match e {
                PgError::Db(db) if db.code == "53400" => definite(format!(
                    "cannot create replication slot {slot:?}: {}; raise max_replication_slots (restart needed) or drop an unused slot with SELECT pg_drop_replication_slot('name')",
                    db.message
                )),
                PgError::Db(db) if db.code == "42501" => definite(format!(
                    "cannot create replication slot {slot:?}: {}; the relay's role needs the REPLICATION attribute: ALTER ROLE ... WITH REPLICATION",
                    db.message
                )),
                other => other.into(),
            })?;
    Ok(created
        .get(0, "consistent_point")
        .and_then(|t| t.parse().ok())
        .unwrap_or_default())
}

/// A slot of that name exists: it must be ours to stream from.
fn check_existing_slot(
    found: &QueryResult,
    slot: &str,
    on_standby: bool,
) -> Result<(), SetupError> {
    let plugin = found.get(0, "plugin").unwrap_or_default();
    if found.get(0, "slot_type") != Some("logical") || plugin != "pgoutput" {
        return Err(definite(format!(
            "replication slot {slot:?} exists but is not a logical pgoutput slot (plugin {plugin:?}): choose another [postgres] slot name or drop it with SELECT pg_drop_replication_slot({})",
            quote_literal(slot)
        )));
    }
    if found.get(0, "database") != found.get(0, "current_db") {
        return Err(definite(format!(
            "replication slot {slot:?} belongs to database {:?}, not {:?}: choose another [postgres] slot name",
            found.get(0, "database").unwrap_or_default(),
            found.get(0, "current_db").unwrap_or_default()
        )));
    }
    // PostgreSQL 16 sets `conflicting` for every invalidated logical slot, WAL removal
    // included (17 names the reason): taken for a recovery conflict only on a standby.
    let conflicting = on_standby && found.get(0, "conflicting") == Some("t");
    if found.get(0, "wal_status") == Some("lost")
        || found.get(0, "invalidation_reason").is_some()
        || conflicting
    {
        let reason = found
            .get(0, "invalidation_reason")
            .map(str::to_owned)
            .or_else(|| conflicting.then(|| "a recovery conflict on the standby".to_owned()));
        return Err(SetupError::SlotInvalidated {
            slot: slot.to_owned(),
            reason,
        });
    }
    Ok(())
}

/// The `START_REPLICATION` command for protocol version 1 (a transaction is sent only
/// after it committed).
pub fn start_replication_command(spec: &SourceSpec, from: Lsn) -> String {
    format!(
        "START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names {}{})",
        quote_ident(&spec.slot),
        from,
        quote_literal(&quote_ident(&spec.publication)),
        if spec.messages {
            ", messages 'true'"
        } else {
            ""
        }
    )
}

/// Parse a PostgreSQL duration setting as `SHOW` prints it: `60s`, `1min`, `500ms`, `0`.
pub fn parse_pg_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: u64 = number.parse().ok()?;
    let millis = match unit.trim() {
        "" | "ms" => number,
        "s" => number.checked_mul(1000)?,
        "min" => number.checked_mul(60_000)?,
        "h" => number.checked_mul(3_600_000)?,
        "d" => number.checked_mul(86_400_000)?,
        _ => return None,
    };
    Some(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::sql::QualifiedName;

    #[test]
    fn start_command_quotes_names() {
        let spec = SourceSpec {
            slot: "s\"lot".into(),
            publication: "pub'x".into(),
            tables: vec![QualifiedName::parse("public.outbox").unwrap()],
            patterns: Vec::new(),
            state_table: QualifiedName::parse("public.outbox_relay_state").unwrap(),
            failover: true,
            messages: false,
            decode_on_standby: false,
        };
        assert_eq!(
            start_replication_command(&spec, Lsn(0x1_0000_0010)),
            "START_REPLICATION SLOT \"s\"\"lot\" LOGICAL 1/10 (proto_version '1', publication_names '\"pub''x\"')"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_pg_duration("60s"), Some(Duration::from_secs(60)));
        assert_eq!(parse_pg_duration("1min"), Some(Duration::from_secs(60)));
        assert_eq!(parse_pg_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_pg_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_pg_duration("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_pg_duration("soon"), None);
    }
}
