//! The PostgreSQL half of the preflight's I/O: read-only catalog queries on an ordinary
//! session, and a `replication=database` session that runs `IDENTIFY_SYSTEM` (what the
//! relay opens first). Nothing is created or changed: no publication, slot, state table
//! or record (compare [`crate::pg::slot::prepare`], which creates what is missing).

use std::time::Duration;

use crate::pg::conn::{PgConnection, PgError, QueryResult, SessionKind};
use crate::pg::slot::SourceSpec;
use crate::pg::sql::{quote_literal, QualifiedName};
use crate::pg::state;
use crate::pg::url::ConnectParams;

use super::facts::{
    ColumnFacts, PgFacts, PublicationFacts, ServerSettings, SlotFacts, StateFacts, TableFacts,
};

/// How long a session's close waits for the server's goodbye.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Gather every fact. `Err` only when no session can be opened at all.
/// `spec`'s patterns are resolved first: the facts are of the tables they match now,
/// which the returned spec lists.
pub async fn pg_facts(
    connect: &ConnectParams,
    spec: &SourceSpec,
) -> Result<(PgFacts, SourceSpec), PgError> {
    let mut conn = PgConnection::connect(connect, SessionKind::Sql).await?;
    let spec = &crate::pg::slot::resolve_tables(&mut conn, spec).await?;
    let facts = gather(&mut conn, spec).await;
    conn.close(CLOSE_WAIT).await;
    let server = facts?;
    // Last, so its walsender is not counted among the active ones.
    let replication_session = replication_session(connect).await;
    Ok((
        PgFacts {
            replication_session,
            ..server
        },
        spec.clone(),
    ))
}

async fn gather(conn: &mut PgConnection, spec: &SourceSpec) -> Result<PgFacts, PgError> {
    let server = server_settings(conn).await?;
    let mut tables = Vec::with_capacity(spec.tables.len());
    for name in &spec.tables {
        tables.push(table(conn, name).await.map_err(|e| e.to_string()));
    }
    let publication = publication(conn, spec).await;
    let slot = slot(conn, spec).await;
    let state = state_table(conn, spec).await;
    Ok(PgFacts {
        server,
        replication_session: Ok(()),
        tables,
        publication: publication.map_err(|e| e.to_string()),
        slot: slot.map_err(|e| e.to_string()),
        state: state.map_err(|e| e.to_string()),
    })
}

async fn replication_session(connect: &ConnectParams) -> Result<(), String> {
    let mut conn = PgConnection::connect(connect, SessionKind::LogicalReplication)
        .await
        .map_err(|e| e.to_string())?;
    let identified = conn.simple_query("IDENTIFY_SYSTEM").await;
    conn.close(CLOSE_WAIT).await;
    identified.map(drop).map_err(|e| e.to_string())
}

fn yes(result: &QueryResult, row: usize, column: &str) -> bool {
    result.get(row, column) == Some("t")
}

fn number<T: std::str::FromStr + Default>(result: &QueryResult, column: &str) -> T {
    result
        .get(0, column)
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

async fn server_settings(conn: &mut PgConnection) -> Result<ServerSettings, PgError> {
    // current_setting(name, true) is NULL for a setting this version lacks.
    let result = conn
        .simple_query(
            "SELECT current_setting('server_version') AS version, \
                    current_setting('server_version_num') AS version_num, \
                    pg_catalog.pg_is_in_recovery() AS in_recovery, \
                    current_setting('wal_level') AS wal_level, \
                    current_setting('max_replication_slots') AS max_slots, \
                    (SELECT count(*) FROM pg_catalog.pg_replication_slots) AS used_slots, \
                    current_setting('max_wal_senders') AS max_senders, \
                    (SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE backend_type = 'walsender') AS active_senders, \
                    current_user AS user_name, current_database() AS database, \
                    r.rolreplication, r.rolsuper, \
                    pg_catalog.has_database_privilege(current_database(), 'CREATE') AS db_create, \
                    pg_catalog.pg_size_bytes(current_setting('max_slot_wal_keep_size', true)) AS keep_size, \
                    current_setting('synchronized_standby_slots', true) AS standby_slots, \
                    pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE') AS read_all_stats, \
                    pg_catalog.pg_has_role('pg_signal_backend', 'USAGE') AS signal_backend, \
                    current_setting('hot_standby_feedback') AS hot_standby_feedback, \
                    coalesce(current_setting('primary_slot_name', true), '') AS primary_slot_name \
               FROM pg_catalog.pg_roles r WHERE r.rolname = current_user",
        )
        .await?;
    let keep: Option<i64> = result.get(0, "keep_size").and_then(|v| v.parse().ok());
    Ok(ServerSettings {
        version: result.get(0, "version").unwrap_or("unknown").to_owned(),
        version_num: number(&result, "version_num"),
        in_recovery: yes(&result, 0, "in_recovery"),
        wal_level: result.get(0, "wal_level").unwrap_or("unknown").to_owned(),
        max_replication_slots: number(&result, "max_slots"),
        used_replication_slots: number(&result, "used_slots"),
        max_wal_senders: number(&result, "max_senders"),
        active_wal_senders: number(&result, "active_senders"),
        user: result.get(0, "user_name").unwrap_or_default().to_owned(),
        database: result.get(0, "database").unwrap_or_default().to_owned(),
        rolreplication: yes(&result, 0, "rolreplication"),
        superuser: yes(&result, 0, "rolsuper"),
        may_create_in_database: yes(&result, 0, "db_create"),
        max_slot_wal_keep_size: keep.filter(|bytes| *bytes >= 0),
        synchronized_standby_slots: result.get(0, "standby_slots").map(str::to_owned),
        reads_all_stats: yes(&result, 0, "read_all_stats"),
        signals_backends: yes(&result, 0, "signal_backend"),
        hot_standby_feedback: result.get(0, "hot_standby_feedback") == Some("on"),
        primary_slot_name: result
            .get(0, "primary_slot_name")
            .unwrap_or_default()
            .to_owned(),
    })
}

async fn table(
    conn: &mut PgConnection,
    name: &QualifiedName,
) -> Result<Option<TableFacts>, PgError> {
    let found = conn
        .simple_query(&format!(
            "SELECT c.oid, c.relkind, pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') AS owned \
               FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = {} AND c.relname = {}",
            quote_literal(&name.schema),
            quote_literal(&name.name)
        ))
        .await?;
    let Some(oid) = found.get(0, "oid") else {
        return Ok(None);
    };
    let columns = conn
        .simple_query(&format!(
            "SELECT attname, atttypid, pg_catalog.format_type(atttypid, atttypmod) AS type_name, attnotnull \
               FROM pg_catalog.pg_attribute WHERE attrelid = {} AND attnum > 0 AND NOT attisdropped \
              ORDER BY attnum",
            quote_literal(oid)
        ))
        .await?;
    Ok(Some(TableFacts {
        relkind: found.get(0, "relkind").unwrap_or_default().to_owned(),
        owned: yes(&found, 0, "owned"),
        columns: (0..columns.rows.len())
            .map(|row| ColumnFacts {
                name: columns.get(row, "attname").unwrap_or_default().to_owned(),
                type_oid: columns
                    .get(row, "atttypid")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_default(),
                type_name: columns.get(row, "type_name").unwrap_or_default().to_owned(),
                not_null: yes(&columns, row, "attnotnull"),
            })
            .collect(),
    }))
}

async fn publication(
    conn: &mut PgConnection,
    spec: &SourceSpec,
) -> Result<Option<PublicationFacts>, PgError> {
    let name = quote_literal(&spec.publication);
    // pubviaroot through jsonb: NULL (false) where the column does not exist.
    let found = conn
        .simple_query(&format!(
            "SELECT p.pubinsert, p.puballtables, \
                    coalesce((pg_catalog.to_jsonb(p) ->> 'pubviaroot')::boolean, false) AS pubviaroot \
               FROM pg_catalog.pg_publication p WHERE p.pubname = {name}"
        ))
        .await?;
    if found.rows.is_empty() {
        return Ok(None);
    }
    let tables = crate::pg::slot::read_publication_tables(
        conn,
        &format!(
            "SELECT schemaname, tablename FROM pg_catalog.pg_publication_tables WHERE pubname = {name}"
        ),
    )
    .await?;
    Ok(Some(PublicationFacts {
        inserts: yes(&found, 0, "pubinsert"),
        via_root: yes(&found, 0, "pubviaroot"),
        all_tables: yes(&found, 0, "puballtables"),
        tables: (0..tables.rows.len())
            .map(|row| {
                (
                    tables.get(row, "schemaname").unwrap_or_default().to_owned(),
                    tables.get(row, "tablename").unwrap_or_default().to_owned(),
                )
            })
            .collect(),
    }))
}

async fn slot(conn: &mut PgConnection, spec: &SourceSpec) -> Result<Option<SlotFacts>, PgError> {
    // invalidation_reason and failover exist from PostgreSQL 17 on: read through jsonb.
    let found = conn
        .simple_query(&format!(
            "SELECT plugin, slot_type, database, wal_status, active_pid, \
                    pg_catalog.to_jsonb(s) ->> 'invalidation_reason' AS invalidation_reason, \
                    coalesce((pg_catalog.to_jsonb(s) ->> 'failover')::boolean, false) AS failover, \
                    pg_catalog.pg_wal_lsn_diff(CASE WHEN pg_catalog.pg_is_in_recovery() \
                        THEN pg_catalog.pg_last_wal_replay_lsn() ELSE pg_catalog.pg_current_wal_lsn() END, \
                        restart_lsn)::bigint AS retained \
               FROM pg_catalog.pg_replication_slots s WHERE slot_name = {}",
            quote_literal(&spec.slot)
        ))
        .await?;
    if found.rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(SlotFacts {
        plugin: found.get(0, "plugin").map(str::to_owned),
        slot_type: found.get(0, "slot_type").unwrap_or_default().to_owned(),
        database: found.get(0, "database").map(str::to_owned),
        wal_status: found.get(0, "wal_status").map(str::to_owned),
        invalidation_reason: found.get(0, "invalidation_reason").map(str::to_owned),
        active_pid: found.get(0, "active_pid").and_then(|v| v.parse().ok()),
        retained_bytes: found.get(0, "retained").and_then(|v| v.parse().ok()),
        failover: yes(&found, 0, "failover"),
    }))
}

async fn state_table(conn: &mut PgConnection, spec: &SourceSpec) -> Result<StateFacts, PgError> {
    let table = &spec.state_table;
    let schema = quote_literal(&table.schema);
    let found = conn
        .simple_query(&format!(
            "SELECT pg_catalog.to_regclass({})::oid AS oid, \
                    EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = {schema}) AS schema_exists",
            quote_literal(&table.quoted())
        ))
        .await?;
    let Some(oid) = found.get(0, "oid").map(str::to_owned) else {
        let schema_exists = yes(&found, 0, "schema_exists");
        let may_create = schema_exists
            && yes(
                &conn
                    .simple_query(&format!(
                        "SELECT pg_catalog.has_schema_privilege({schema}, 'CREATE') AS may"
                    ))
                    .await?,
                0,
                "may",
            );
        return Ok(StateFacts::Missing {
            schema_exists,
            may_create,
        });
    };
    let privileges = conn
        .simple_query(&format!(
            "SELECT pg_catalog.has_table_privilege({oid}::oid, 'SELECT') AS s, \
                    pg_catalog.has_table_privilege({oid}::oid, 'INSERT') AS i, \
                    pg_catalog.has_table_privilege({oid}::oid, 'UPDATE') AS u",
            oid = quote_literal(&oid)
        ))
        .await?;
    let may_select = yes(&privileges, 0, "s");
    let record = if may_select {
        state::read(conn, table, &spec.slot).await?
    } else {
        None
    };
    Ok(StateFacts::Exists {
        may_select,
        may_insert: yes(&privileges, 0, "i"),
        may_update: yes(&privileges, 0, "u"),
        record,
    })
}
